// The Java kernel of vmon's code-execution service (internal/codeinterp): one JVM per context,
// running cells through JShell (the jdk.jshell API) in this JVM, so state carries over from cell
// to cell. Requests arrive on stdin, one per line: the cell's id, a space, and its code in
// base64 (the JDK has no JSON parser, and this framing needs none). Everything a cell produces
// goes out on file descriptor 3 as node-runner.js's events, one JSON object per line, in order:
//   {id, type: "stream", name: "stdout"|"stderr", text}
//   {id, type: "result", text}                the value of the cell's last expression
//   {id, type: "error", name, value, stack}
//   {id, type: "done", count}
// A cell's value is shown as E2B's Java kernel (IJava) shows it: String.valueOf of the last
// snippet's value when that snippet is an expression (not an assignment or a declaration), and
// nothing when the value is null; so a String comes without JShell's quotes.
// SIGINT stops the running cell; the context stays. A cell whose first line is "//vmon-env"
// sets environment variables instead of running code, one per following line: "set NAME VALUE"
// or "unset NAME", both base64; a line "save" first keeps the values they replace, which a
// later line "restore" puts back (an execution's own variables). A JVM cannot change its own
// environment, so the runner changes the maps behind System.getenv() and ProcessBuilder (java.base
// is opened to it for that); it sets the same names as system properties, which is where E2B's
// service puts them (System.setProperty), so code written for E2B finds them there too.
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;

import jdk.jshell.DeclarationSnippet;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.execution.LocalExecutionControl;
import jdk.jshell.spi.ExecutionControl;
import jdk.jshell.spi.ExecutionControlProvider;
import jdk.jshell.spi.ExecutionEnv;

public class JavaRunner {
    private static PrintStream events;
    private static volatile String current;
    private static int count;
    // saved and savedProps hold what an execution's own variables replaced (null: was unset).
    private static final Map<String, String> saved = new java.util.HashMap<>();
    private static final Map<String, String> savedProps = new java.util.HashMap<>();
    private static ValueControl control;

    public static void main(String[] args) throws Exception {
        events = new PrintStream(new FileOutputStream("/proc/self/fd/3"), true, StandardCharsets.UTF_8);
        System.setOut(new PrintStream(new Forward("stdout"), true, StandardCharsets.UTF_8));
        System.setErr(new PrintStream(new Forward("stderr"), true, StandardCharsets.UTF_8));
        JShell shell = JShell.builder().executionEngine(new ExecutionControlProvider() {
            @Override
            public String name() {
                return "vmon-local";
            }

            @Override
            public ExecutionControl generate(ExecutionEnv env, Map<String, String> params) {
                control = new ValueControl();
                return control;
            }
        }, null).build();
        // Warm the compiler before saying ready: the first cell of a context is not slower.
        shell.eval("int __vmon_warm = 0;");
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), sig -> shell.stop());
        send("{\"id\":null,\"type\":\"ready\"}");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            int space = line.indexOf(' ');
            String id = space < 0 ? line : line.substring(0, space);
            String code = space < 0 ? "" : new String(Base64.getDecoder().decode(line.substring(space + 1).strip()), StandardCharsets.UTF_8);
            current = id;
            count++;
            try {
                if (code.startsWith("//vmon-env\n")) {
                    setEnv(code.substring("//vmon-env\n".length()));
                } else {
                    run(shell, id, code);
                }
            } catch (Throwable t) {
                error(id, t.getClass().getSimpleName(), String.valueOf(t.getMessage()), stack(t));
            } finally {
                System.out.flush();
                System.err.flush();
                send("{\"id\":" + Json.quote(id) + ",\"type\":\"done\",\"count\":" + count + "}");
                current = null;
            }
        }
        System.exit(0);
    }

    private static void run(JShell shell, String id, String code) throws Exception {
        SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
        String remaining = code;
        String value = null;
        while (!remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            if (!info.completeness().isComplete()) {
                // IJava's name for it.
                error(id, "IncompleteSourceException", "incomplete input: " + remaining.strip(), remaining.strip());
                return;
            }
            remaining = info.remaining();
            value = null;
            control.forget();
            for (SnippetEvent e : shell.eval(info.source())) {
                if (e.causeSnippet() != null) {
                    continue; // an update of a dependent snippet, not this one
                }
                Snippet s = e.snippet();
                if (e.status() == Snippet.Status.REJECTED) {
                    StringBuilder msg = new StringBuilder();
                    for (Diag d : shell.diagnostics(s).toList()) {
                        msg.append(d.getMessage(null)).append('\n');
                    }
                    error(id, "CompilationException", msg.toString().strip(), s.source().strip() + "\n" + msg.toString().strip());
                    return;
                }
                if (e.exception() != null) {
                    JShellException ex = e.exception();
                    String name = ex instanceof EvalException ee ? simple(ee.getExceptionClassName())
                            : ex instanceof UnresolvedReferenceException ? "UnresolvedReferenceException" : ex.getClass().getSimpleName();
                    String message = ex instanceof UnresolvedReferenceException ur
                            ? "unresolved reference: " + shell.unresolvedDependencies((DeclarationSnippet) ur.getSnippet()).toList()
                            : String.valueOf(ex.getMessage());
                    error(id, name, message, name + ": " + message + "\n" + stack(ex));
                    return;
                }
                if (isValue(s) && control.hasValue()) {
                    try {
                        value = control.show();
                    } catch (InvocationTargetException ex) {
                        Throwable t = ex.getCause();
                        error(id, t.getClass().getSimpleName(), String.valueOf(t.getMessage()), t + "\n" + stack(t));
                        return;
                    } catch (ExecutionControl.StoppedException ex) {
                        error(id, "EvalException", "stopped while showing the value", "");
                        return;
                    }
                }
            }
        }
        if (value != null) {
            System.out.flush();
            System.err.flush();
            send("{\"id\":" + Json.quote(id) + ",\"type\":\"result\",\"text\":" + Json.quote(value) + "}");
        }
    }

    // isValue: an expression, whose value is the cell's; as in IJava, a declaration or an
    // assignment has none.
    private static boolean isValue(Snippet s) {
        return switch (s.subKind()) {
            case VAR_VALUE_SUBKIND, OTHER_EXPRESSION_SUBKIND, TEMP_VAR_EXPRESSION_SUBKIND -> true;
            default -> false;
        };
    }

    // ValueControl runs snippets as JShell's local engine does, and keeps the object the last one
    // produced (the engine itself keeps only JShell's rendering of it, quotes and all). Snippets
    // run on the engine's thread, which JShell.stop() stops; so does the value's toString().
    static final class ValueControl extends LocalExecutionControl {
        private static final Method RELAY;
        private static final Method SHOW;

        static {
            try {
                RELAY = ValueControl.class.getDeclaredMethod("relay");
                SHOW = ValueControl.class.getDeclaredMethod("showLast");
            } catch (NoSuchMethodException e) {
                throw new ExceptionInInitializerError(e);
            }
            // The engine invokes them from jdk.jshell, which cannot see this class otherwise.
            RELAY.setAccessible(true);
            SHOW.setAccessible(true);
        }

        private static volatile Method doit;
        private static volatile boolean ran;
        private static volatile Object last;
        private static volatile String shown;

        void forget() {
            ran = false;
            last = null;
        }

        // hasValue says whether the last snippet run gave a value IJava would show (not null).
        boolean hasValue() {
            return ran && last != null;
        }

        // show renders the last value with String.valueOf, as IJava does.
        String show() throws Exception {
            clientCodeEnter();
            try {
                super.invoke(SHOW);
                return shown;
            } finally {
                clientCodeLeave();
            }
        }

        @Override
        protected String invoke(Method doitMethod) throws Exception {
            doit = doitMethod;
            return super.invoke(RELAY);
        }

        // relay runs the snippet and hands the engine nothing to render: the engine would call
        // the value's toString() on the caller's thread, where nothing can stop it.
        private static Object relay() throws Throwable {
            try {
                last = doit.invoke(null);
                ran = true;
                return null;
            } catch (InvocationTargetException e) {
                throw e.getCause(); // the snippet's own exception, as the engine expects it
            }
        }

        private static Object showLast() {
            shown = String.valueOf(last);
            return null;
        }
    }

    private static String simple(String className) {
        return className.substring(className.lastIndexOf('.') + 1);
    }

    private static String stack(Throwable t) {
        StringBuilder b = new StringBuilder();
        // JShell translates a cell's frames: no class, the snippet number as the file.
        for (StackTraceElement el : t.getStackTrace()) {
            String cls = el.getClassName();
            if (cls.startsWith("jdk.jshell.") || cls.startsWith("java.lang.reflect.") || cls.startsWith("jdk.internal.")) {
                break;
            }
            b.append("\tat ").append(cls.isEmpty() ? "" : cls + ".").append(el.getMethodName())
                    .append('(').append(el.getFileName()).append(':').append(el.getLineNumber()).append(")\n");
        }
        return b.toString().stripTrailing();
    }

    private static void error(String id, String name, String value, String stack) {
        System.out.flush();
        System.err.flush();
        send("{\"id\":" + Json.quote(id) + ",\"type\":\"error\",\"name\":" + Json.quote(name) + ",\"value\":"
                + Json.quote(value) + ",\"stack\":" + Json.quote(stack) + "}");
    }

    private static synchronized void send(String json) {
        events.println(json);
    }

    @SuppressWarnings("unchecked")
    private static void setEnv(String spec) throws Exception {
        Map<String, String> env = new java.util.LinkedHashMap<>();
        // props: the system properties to change, which may differ from env on a restore.
        Map<String, String> props = new java.util.LinkedHashMap<>();
        Base64.Decoder b64 = Base64.getDecoder();
        boolean save = false;
        for (String l : spec.split("\n")) {
            String[] f = l.strip().split(" ");
            if (f.length == 1 && f[0].equals("save")) {
                save = true;
            } else if (f.length == 1 && f[0].equals("restore")) {
                env.putAll(saved);
                saved.clear();
                props.putAll(savedProps);
                savedProps.clear();
            } else if (f.length == 3 && f[0].equals("set")) {
                String k = new String(b64.decode(f[1]), StandardCharsets.UTF_8);
                String v = new String(b64.decode(f[2]), StandardCharsets.UTF_8);
                env.put(k, v);
                props.put(k, v);
            } else if (f.length == 2 && f[0].equals("unset")) {
                String k = new String(b64.decode(f[1]), StandardCharsets.UTF_8);
                env.put(k, null);
                props.put(k, null);
            } else if (!l.isBlank()) {
                throw new IllegalArgumentException("bad //vmon-env line: " + l);
            }
        }
        if (save) {
            saved.clear();
            savedProps.clear();
            for (String k : env.keySet()) {
                saved.put(k, System.getenv(k));
                savedProps.put(k, System.getProperty(k));
            }
        }
        Map<String, String> view = System.getenv();
        Field m = view.getClass().getDeclaredField("m");
        m.setAccessible(true);
        Map<String, String> getenv = (Map<String, String>) m.get(view);
        Class<?> pe = Class.forName("java.lang.ProcessEnvironment");
        Field f = pe.getDeclaredField("theEnvironment");
        f.setAccessible(true);
        Map<Object, Object> children = (Map<Object, Object>) f.get(null);
        Class<?> variable = Class.forName("java.lang.ProcessEnvironment$Variable");
        Class<?> value = Class.forName("java.lang.ProcessEnvironment$Value");
        var valueOfVariable = variable.getDeclaredMethod("valueOf", String.class);
        var valueOfValue = value.getDeclaredMethod("valueOf", String.class);
        valueOfVariable.setAccessible(true);
        valueOfValue.setAccessible(true);
        for (Map.Entry<String, String> e : env.entrySet()) {
            Object k = valueOfVariable.invoke(null, e.getKey());
            if (e.getValue() == null) {
                getenv.remove(e.getKey());
                children.remove(k);
            } else {
                getenv.put(e.getKey(), e.getValue());
                children.put(k, valueOfValue.invoke(null, e.getValue()));
            }
        }
        for (Map.Entry<String, String> e : props.entrySet()) {
            if (e.getValue() == null) {
                System.clearProperty(e.getKey());
            } else {
                System.setProperty(e.getKey(), e.getValue());
            }
        }
    }

    // Forward turns what a cell prints into stream events, a line (or a full buffer) at a time.
    private static final class Forward extends OutputStream {
        private final String name;
        private final ByteArrayOutputStream buf = new ByteArrayOutputStream();

        Forward(String name) {
            this.name = name;
        }

        @Override
        public synchronized void write(int b) {
            buf.write(b);
            if (b == '\n' || buf.size() >= 8192) {
                flush();
            }
        }

        @Override
        public synchronized void write(byte[] b, int off, int len) {
            buf.write(b, off, len);
            if (buf.size() >= 8192 || (len > 0 && b[off + len - 1] == '\n')) {
                flush();
            }
        }

        @Override
        public synchronized void flush() {
            if (buf.size() == 0) {
                return;
            }
            String text = buf.toString(StandardCharsets.UTF_8);
            buf.reset();
            send("{\"id\":" + Json.quote(current) + ",\"type\":\"stream\",\"name\":\"" + name + "\",\"text\":" + Json.quote(text) + "}");
        }
    }

    // Json quotes strings for the events (writing JSON; the runner reads none).
    static final class Json {
        static String quote(String s) {
            if (s == null) {
                return "null";
            }
            StringBuilder b = new StringBuilder("\"");
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"' -> b.append("\\\"");
                    case '\\' -> b.append("\\\\");
                    case '\n' -> b.append("\\n");
                    case '\r' -> b.append("\\r");
                    case '\t' -> b.append("\\t");
                    default -> {
                        if (c < 0x20) {
                            b.append(String.format("\\u%04x", (int) c));
                        } else {
                            b.append(c);
                        }
                    }
                }
            }
            return b.append('"').toString();
        }
    }
}
