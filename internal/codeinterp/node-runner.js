// The JavaScript/TypeScript kernel of vmon's code-execution service (internal/codeinterp): one
// Node.js process per context, running cells in one persistent vm context. Requests arrive on
// stdin, one JSON object per line ({id, code, lang}); everything the cell produces goes out on
// file descriptor 3, one JSON object per line, in the order it happened:
//   {id, type: "stream", name: "stdout"|"stderr", text}
//   {id, type: "result", text}                the cell's value (util.inspect)
//   {id, type: "error", name, value, stack}
//   {id, type: "done", count}
// {interrupt: id} on stdin interrupts cell id while it awaits; SIGINT interrupts it either way (a
// synchronous loop too). The context stays.
'use strict';
const fs = require('fs');
const readline = require('readline');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const path = require('path');
const { pathToFileURL } = require('url');

const send = (msg) => fs.writeSync(3, JSON.stringify(msg) + '\n');
let current = null; // the id of the running cell
let count = 0;

for (const name of ['stdout', 'stderr']) {
  const stream = process[name];
  stream.write = (chunk, encoding, cb) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString(typeof encoding === 'string' ? encoding : 'utf8');
    send({ id: current, type: 'stream', name, text });
    if (typeof encoding === 'function') encoding();
    else if (typeof cb === 'function') cb();
    return true;
  };
}

// Cells require modules relative to the working directory, as a script there would.
const cellRequire = Module.createRequire(process.cwd() + '/');
const sandbox = { require: cellRequire, module: { exports: {} }, process, console, Buffer, URL, URLSearchParams,
  TextEncoder, TextDecoder, fetch: globalThis.fetch, structuredClone, queueMicrotask, AbortController,
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate };
sandbox.exports = sandbox.module.exports;
sandbox.global = sandbox;
sandbox.globalThis = sandbox;
const context = vm.createContext(sandbox);

let typescript = null;
// loadTypescript returns Debian's node-typescript: the TypeScript compiler, and the JavaScript
// parser behind top-level await and import in cells.
function loadTypescript(why) {
  if (!typescript) {
    for (const name of ['typescript', '/usr/share/nodejs/typescript']) {
      try {
        typescript = require(name);
        break;
      } catch {
        // next
      }
    }
    if (!typescript) {
      const err = new Error(`TypeScript is not installed in this sandbox (Debian package node-typescript); ${why} needs it`);
      err.name = 'LanguageNotAvailable';
      throw err;
    }
  }
  return typescript;
}

function transpile(code) {
  const ts = loadTypescript('TypeScript');
  return ts.transpileModule(code, {
    // preserveValueImports: an import a later cell uses is kept, not elided as unused here.
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022, preserveValueImports: true },
  }).outputText;
}

// Cells import modules as a script in the context's directory would: Node built-ins by name,
// relative paths from the working directory, packages from its node_modules (CommonJS or ESM).
sandbox.__vmonImport = (spec) => {
  if (spec.startsWith('node:') || Module.isBuiltin(spec)) return import(spec);
  if (spec.startsWith('.') || spec.startsWith('/')) return import(pathToFileURL(path.resolve(process.cwd(), spec)).href);
  let resolved;
  try {
    resolved = pathToFileURL(Module.createRequire(path.join(process.cwd(), '/')).resolve(spec)).href;
  } catch {
    resolved = spec;
  }
  return import(resolved);
};

// asyncCell turns a cell with top-level await or import declarations into the body of an async
// function that behaves like the cell at the top level, as a REPL does: import declarations
// become awaited dynamic imports, top-level declarations become globals (so later cells see
// them), and the last expression statement is returned (the cell's value).
function asyncCell(code) {
  const ts = loadTypescript('a cell with top-level await or import');
  const sf = ts.createSourceFile('cell.js', code, ts.ScriptTarget.Latest, true, ts.ScriptKind.JS);
  const src = (n) => code.slice(n.getStart(sf), n.end);
  const edits = [];
  const replace = (node, text) => edits.push({ start: node.getStart(sf), end: node.end, text });
  let tmp = 0;
  sf.statements.forEach((st, i) => {
    const last = i === sf.statements.length - 1;
    if (ts.isImportDeclaration(st)) {
      const from = `await __vmonImport(${src(st.moduleSpecifier)})`;
      const c = st.importClause;
      if (!c) return replace(st, `${from};`);
      const parts = [];
      let ns = from;
      if (c.name && c.namedBindings) {
        ns = `__vmon_import_${tmp++}`;
        parts.push(`globalThis.${ns} = ${from};`);
        ns = `globalThis.${ns}`;
      }
      if (c.name) parts.push(`${c.name.text} = (${ns}).default;`);
      if (c.namedBindings && ts.isNamespaceImport(c.namedBindings)) parts.push(`${c.namedBindings.name.text} = ${ns};`);
      if (c.namedBindings && ts.isNamedImports(c.namedBindings)) {
        const names = c.namedBindings.elements.map((e) => (e.propertyName ? `${e.propertyName.text}: ${e.name.text}` : e.name.text));
        parts.push(`({ ${names.join(', ')} } = ${ns});`);
      }
      return replace(st, parts.join(' '));
    }
    if (ts.isVariableStatement(st)) {
      // const/let/var x = v → x = v, on the context's global object (sloppy mode assigns globals).
      const assigns = st.declarationList.declarations.map((d) => {
        const target = src(d.name);
        const value = d.initializer ? src(d.initializer) : 'undefined';
        return ts.isObjectBindingPattern(d.name) ? `(${target} = ${value})` : `${target} = ${value}`;
      });
      return replace(st, `void (${assigns.join(', ')});`);
    }
    if (ts.isFunctionDeclaration(st) && st.name) {
      return edits.push({ start: st.end, end: st.end, text: `\nglobalThis.${st.name.text} = ${st.name.text};` });
    }
    if (ts.isClassDeclaration(st) && st.name) return replace(st, `${st.name.text} = ${src(st)};`);
    // TypeScript's module output may end with `export {}`: a cell exports nothing.
    if (ts.isExportDeclaration(st) && !st.moduleSpecifier) return replace(st, '');
    if (last && ts.isExpressionStatement(st)) return replace(st, `return (${src(st.expression)});`);
  });
  let out = code;
  for (const e of edits.sort((a, b) => b.start - a.start)) out = out.slice(0, e.start) + e.text + out.slice(e.end);
  return `(async () => {\n${out}\n})()`;
}

let interrupt = null;
process.on('SIGINT', () => {
  if (interrupt) interrupt(new Error('Execution was interrupted'));
});

async function run(code, lang) {
  if (lang === 'typescript') code = transpile(code);
  let script;
  try {
    script = new vm.Script(code, { filename: 'cell' });
  } catch (err) {
    // Top-level await, an import declaration or a top-level return: a cell that only runs as
    // the body of an async function.
    if (!(err instanceof SyntaxError && /await|import|export|return/.test(err.message))) throw err;
    script = new vm.Script(asyncCell(code), { filename: 'cell' });
  }
  let value = script.runInContext(context, { breakOnSigint: true });
  if (value && typeof value.then === 'function') {
    value = await Promise.race([value, new Promise((_, reject) => (interrupt = reject))]);
  }
  return value;
}

// text is String(v) for anything a cell can throw, even an object whose conversion throws.
function text(v) {
  try {
    return String(v);
  } catch {
    try {
      return util.inspect(v);
    } catch {
      return '(a value that cannot be shown)';
    }
  }
}

const queue = [];
let busy = false;
async function next() {
  if (busy || queue.length === 0) return;
  busy = true;
  const req = queue.shift();
  current = req.id;
  count++;
  try {
    const value = await run(req.code, req.lang);
    if (value !== undefined) send({ id: req.id, type: 'result', text: util.inspect(value, { depth: 4, colors: false }) });
  } catch (err) {
    const e = err instanceof Error || (err && typeof err === 'object') ? err : { name: 'Error', message: text(err) };
    // Whatever was thrown, the fields go out as strings (the service reads them as such).
    send({ id: req.id, type: 'error', name: text(e.name || 'Error'), value: text(e.message ?? err), stack: text(e.stack || err) });
  } finally {
    interrupt = null;
    send({ id: req.id, type: 'done', count });
    current = null;
    busy = false;
    setImmediate(next);
  }
}

readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const msg = JSON.parse(line);
  if (msg.interrupt !== undefined) {
    // The service's interrupt of a cell that waits; one for a cell already done is stale.
    if (msg.interrupt === current && interrupt) interrupt(new Error('Execution was interrupted'));
    return;
  }
  queue.push(msg);
  next();
}).on('close', () => process.exit(0));
send({ id: null, type: 'ready' });
