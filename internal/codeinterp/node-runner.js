// The JavaScript/TypeScript kernel of vmon's code-execution service (internal/codeinterp): one
// Node.js process per context, running cells in one persistent vm context. Requests arrive on
// stdin, one JSON object per line ({id, code, lang}); everything the cell produces goes out on
// file descriptor 3, one JSON object per line, in the order it happened:
//   {id, type: "stream", name: "stdout"|"stderr", text}
//   {id, type: "result", text}                the cell's value (util.inspect)
//   {id, type: "error", name, value, stack}
//   {id, type: "done", count}
// SIGINT interrupts the running cell (a synchronous loop or a pending await); the context stays.
'use strict';
const fs = require('fs');
const readline = require('readline');
const util = require('util');
const vm = require('vm');
const Module = require('module');

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
function transpile(code) {
  if (!typescript) {
    try {
      typescript = require('typescript');
    } catch {
      const err = new Error('TypeScript is not installed in this sandbox (Debian package node-typescript)');
      err.name = 'LanguageNotAvailable';
      throw err;
    }
  }
  return typescript.transpileModule(code, {
    compilerOptions: { target: typescript.ScriptTarget.ES2022, module: typescript.ModuleKind.ES2022 },
  }).outputText;
}

let interrupt = null;
process.on('SIGINT', () => {
  if (interrupt) interrupt(new Error('Execution was interrupted'));
});

async function run(code, lang) {
  if (lang === 'typescript') code = transpile(code);
  let value;
  try {
    value = new vm.Script(code, { filename: 'cell' }).runInContext(context, { breakOnSigint: true });
  } catch (err) {
    // Top-level await: run the cell as the body of an async function (its value is lost unless
    // the cell returns it).
    if (!(err instanceof SyntaxError && /await/.test(err.message))) throw err;
    value = new vm.Script(`(async () => {\n${code}\n})()`, { filename: 'cell' }).runInContext(context, { breakOnSigint: true });
  }
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
  queue.push(JSON.parse(line));
  next();
}).on('close', () => process.exit(0));
send({ id: null, type: 'ready' });
