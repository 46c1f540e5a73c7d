// The runtime baseline: what vmon's create does, done directly with runsc, on the same template
// rootfs and with the same runsc flags and OCI config shape as vmon.
//
//   node bench/runtime.mjs --n 30 --out F --data-dir D [--template-config F] [--warmup 1]
//                          [--runsc /usr/local/bin/runsc] [--platform systrap]
//
// Per iteration (each cleaned up before the next, cleanup not timed):
//   setup (timed separately): overlay of <data>/templates/base/<rootfs> with a fresh upper/work
//     (mount -t overlay, the options vmon uses), `ip netns add` + loopback up, config.json;
//   measured: `runsc run --detach` (as vmon does) + `runsc exec <id> true`.
// The config is vmon's own config.json captured from a live sandbox (--template-config, written
// by `sdk.mjs create --capture-config`) with the paths, netns, cgroup and init rewritten; the init
// is `sleep infinity` instead of envd, since nothing here talks to envd.
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { now, stats, writeJson, parseArgs, run, runOk } from './lib.mjs';

const args = parseArgs(process.argv.slice(2));
const n = Number(args.n ?? 30);
const warmup = Number(args.warmup ?? 1);
const dataDir = path.resolve(args['data-dir'] ?? '/var/lib/vmon-bench');
const runscPath = args.runsc ?? '/usr/local/bin/runsc';
const platform = args.platform ?? 'systrap';
const CGROUP_PARENT = 'vmonbench';
const PATH_ENV = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

// Every capability gVisor implements, as spec.go's allCaps (only for the built-in config).
const ALL_CAPS = [
  'CHOWN', 'DAC_OVERRIDE', 'DAC_READ_SEARCH', 'FOWNER', 'FSETID', 'KILL', 'SETGID', 'SETUID', 'SETPCAP',
  'LINUX_IMMUTABLE', 'NET_BIND_SERVICE', 'NET_BROADCAST', 'NET_ADMIN', 'NET_RAW', 'IPC_LOCK', 'IPC_OWNER',
  'SYS_MODULE', 'SYS_RAWIO', 'SYS_CHROOT', 'SYS_PTRACE', 'SYS_PACCT', 'SYS_ADMIN', 'SYS_BOOT', 'SYS_NICE',
  'SYS_RESOURCE', 'SYS_TIME', 'SYS_TTY_CONFIG', 'MKNOD', 'LEASE', 'AUDIT_WRITE', 'AUDIT_CONTROL', 'SETFCAP',
  'MAC_OVERRIDE', 'MAC_ADMIN', 'SYSLOG', 'WAKE_ALARM', 'BLOCK_SUSPEND', 'AUDIT_READ', 'PERFMON', 'BPF',
  'CHECKPOINT_RESTORE',
].map((c) => `CAP_${c}`);

const workRoot = path.join(dataDir, 'bench-runtime');
const runscRoot = path.join(workRoot, 'runsc');
// The flags vmon gives every runsc command (internal/runtime/gvisor/gvisor.go).
const runscFlags = [
  `--root=${runscRoot}`,
  `--platform=${platform}`,
  '--network=sandbox',
  '--host-uds=open',
  '--overlay2=none',
  '--allow-suid',
];
const runscEnv = { PATH: PATH_ENV.slice(5) };

const manifest = JSON.parse(fs.readFileSync(path.join(dataDir, 'templates', 'base', 'manifest.json'), 'utf8'));
const lowerDir = path.join(dataDir, 'templates', 'base', manifest.rootfs);

let captured = null;
if (args['template-config'] && fs.existsSync(args['template-config'])) {
  captured = JSON.parse(fs.readFileSync(args['template-config'], 'utf8'));
}

export const runsc = (sub, rest, opts = {}) => run(runscPath, [...runscFlags, sub, ...rest], { env: runscEnv, ...opts });

/** The OCI config for iteration `id`: vmon's captured config rewritten, or the same shape built here. */
function buildConfig(id, dir, netnsName, initArgs = ['/bin/sleep', 'infinity']) {
  const netnsPath = `/run/netns/${netnsName}`;
  let cfg;
  if (captured) {
    const oldDir = path.join(captured.dataDir, 'sandboxes', captured.sandboxId);
    const text = JSON.stringify(captured.config).split(oldDir).join(dir);
    cfg = JSON.parse(text);
    for (const ns of cfg.linux?.namespaces ?? []) if (ns.type === 'network') ns.path = netnsPath;
    if (cfg.linux?.cgroupsPath) cfg.linux.cgroupsPath = `/${CGROUP_PARENT}/${id}`;
    if (cfg.hostname === captured.sandboxId) cfg.hostname = id;
    const left = JSON.stringify(cfg);
    if (left.includes(captured.sandboxId)) throw new Error(`captured config still names ${captured.sandboxId} after rewriting`);
  } else {
    // Same shape as internal/runtime/gvisor/spec.go writes (minus the envd/agent mounts).
    const caps = ALL_CAPS;
    cfg = {
      ociVersion: '1.2.1',
      process: {
        user: { uid: 0, gid: 0 },
        args: [],
        env: [PATH_ENV],
        cwd: '/',
        capabilities: { bounding: caps, effective: caps, permitted: caps },
        rlimits: [{ type: 'RLIMIT_NOFILE', hard: 1 << 20, soft: 1 << 20 }],
      },
      root: { path: path.join(dir, 'root') },
      hostname: 'vmon',
      mounts: [
        { destination: '/proc', type: 'proc', source: 'proc' },
        { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755'] },
        { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'] },
        { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'nodev', 'mode=1777'] },
        { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
        { destination: '/tmp', type: 'bind', source: path.join(dir, 'root', 'tmp'), options: ['rbind', 'rw'] },
      ],
      linux: {
        namespaces: [{ type: 'pid' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }, { type: 'network', path: netnsPath }],
        cgroupsPath: `/${CGROUP_PARENT}/${id}`,
        resources: {
          cpu: { quota: (manifest.cpuCount || 2) * 100_000, period: 100_000 },
          memory: { limit: (manifest.memoryMB || 512) * 1024 * 1024 },
        },
      },
    };
  }
  cfg.process.args = initArgs;
  return cfg;
}

async function isMounted(p) {
  return (await run('mountpoint', ['-q', p])).code === 0;
}

function cgroupDirs(leaf) {
  const base = '/sys/fs/cgroup';
  const out = [];
  for (const ctrl of fs.readdirSync(base)) {
    const d = path.join(base, ctrl, CGROUP_PARENT, ...(leaf ? [leaf] : []));
    if (fs.existsSync(d)) out.push(d);
  }
  return out;
}

/** Undo everything iteration `it` made; safe to call on a partly set up iteration. */
export async function teardown(it) {
  const errs = [];
  it.agent?.close();
  if (it.hostLink) await run('ip', ['link', 'del', it.hostLink]);
  await runsc('kill', [it.id, 'KILL'], { timeoutMs: 20_000 });
  const del = await runsc('delete', ['--force', it.id], { timeoutMs: 30_000 });
  if (del.code !== 0 && !/does not exist/.test(del.stderr)) errs.push(`runsc delete: ${del.stderr.trim()}`);
  const root = path.join(it.dir, 'root');
  for (let i = 0; i < 8 && fs.existsSync(root) && (await isMounted(root)); i++) {
    const u = await run('umount', [root]);
    if (u.code !== 0) await run('umount', ['-l', root]);
  }
  if (fs.existsSync(root) && (await isMounted(root))) errs.push(`${root} still mounted`);
  if (fs.existsSync(`/run/netns/${it.netns}`)) {
    const r = await run('ip', ['netns', 'del', it.netns]);
    if (r.code !== 0) errs.push(`ip netns del ${it.netns}: ${r.stderr.trim()}`);
  }
  for (const d of cgroupDirs(it.id)) {
    try {
      fs.rmdirSync(d);
    } catch (err) {
      errs.push(`rmdir ${d}: ${err.code}`);
    }
  }
  if (!errs.some((e) => e.includes('still mounted'))) fs.rmSync(it.dir, { recursive: true, force: true });
  if (errs.length) throw new Error(`teardown of ${it.id}: ${errs.join('; ')}`);
}

/** Prepares iteration `it` ({id, dir, netns, init?}): overlay, namespace, config.json. */
export async function setup(it) {
  fs.mkdirSync(it.dir, { mode: 0o700 });
  fs.mkdirSync(path.join(it.dir, 'agent'), { mode: 0o755 });
  const upper = path.join(it.dir, 'upper');
  const work = path.join(it.dir, 'work');
  const root = path.join(it.dir, 'root');
  for (const d of [upper, work, root]) fs.mkdirSync(d, { mode: 0o755 });
  const st = fs.statSync(lowerDir);
  fs.chownSync(upper, st.uid, st.gid);
  fs.chmodSync(upper, st.mode & 0o7777);
  await runOk('mount', ['-t', 'overlay', 'overlay', '-o',
    `lowerdir=${lowerDir},upperdir=${upper},workdir=${work},index=off,xino=off`, root]);
  const tmp = path.join(root, 'tmp');
  if (!fs.existsSync(tmp)) {
    fs.mkdirSync(tmp);
    fs.chmodSync(tmp, 0o1777);
  }
  await runOk('ip', ['netns', 'add', it.netns]);
  await runOk('ip', ['-n', it.netns, 'link', 'set', 'lo', 'up']);
  if (it.vmonShape) await vmonShape(it);
  fs.writeFileSync(path.join(it.dir, 'config.json'), JSON.stringify(buildConfig(it.id, it.dir, it.netns, it.init), null, 2));
}

// What a vmon sandbox has besides its rootfs, so a checkpoint and a restore save and bring back
// the same kernel state: a veth link with an address and default route (as netpool's), and
// envd's agent channel connected to a host socket (held open; a restored envd redials it).
let linkSeq = 0;
async function vmonShape(it) {
  const k = (process.pid + linkSeq++) % 16000;
  const sub = `10.${200 + (k >> 8) % 50}.${k & 255}`;
  it.hostLink = `vbr${k}`;
  await runOk('ip', ['link', 'add', it.hostLink, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', it.netns]);
  await runOk('ip', ['addr', 'add', `${sub}.1/30`, 'dev', it.hostLink]);
  await runOk('ip', ['link', 'set', it.hostLink, 'up']);
  await runOk('ip', ['-n', it.netns, 'addr', 'add', `${sub}.2/30`, 'dev', 'eth0']);
  await runOk('ip', ['-n', it.netns, 'link', 'set', 'eth0', 'up']);
  await runOk('ip', ['-n', it.netns, 'route', 'add', 'default', 'via', `${sub}.1`]);
  it.agent = net.createServer((c) => {
    c.on('data', () => {});
    c.on('error', () => {});
  });
  await new Promise((resolve, reject) => {
    it.agent.once('error', reject);
    it.agent.listen(path.join(it.dir, 'agent', 'agent.sock'), resolve);
  });
}

export async function bootAndExec(it) {
  const consoleFd = fs.openSync(path.join(it.dir, 'console.log'), 'a', 0o600);
  try {
    // detached: runsc (and the sandbox it forks) in its own session, as vmon runs it.
    const c = await runsc('run', ['--detach', '--bundle', it.dir, '--pid-file', path.join(it.dir, 'sandbox.pid'), it.id], {
      stdio: ['ignore', consoleFd, consoleFd],
      detached: true,
      timeoutMs: 60_000,
    });
    if (c.code !== 0) {
      throw new Error(`runsc run --detach exited ${c.code ?? c.signal}: ${fs.readFileSync(path.join(it.dir, 'console.log'), 'utf8').slice(-800)}`);
    }
  } finally {
    fs.closeSync(consoleFd);
  }
  const tStarted = now();
  const e = await runsc('exec', [it.id, 'true'], { timeoutMs: 60_000 });
  if (e.code !== 0) throw new Error(`runsc exec true exited ${e.code}: ${e.stderr.trim()}`);
  return tStarted;
}

/** The runsc root and work directory raw sandboxes live in (create with prepareRoot). */
export const paths = { workRoot, runscRoot };
export function prepareRoot() {
  fs.mkdirSync(runscRoot, { recursive: true, mode: 0o700 });
}

/** Removes the runsc root, its cgroup parent and the work directory once every iteration is gone. */
export async function cleanupRoot() {
  for (const d of cgroupDirs(null)) {
    try {
      fs.rmdirSync(d);
    } catch {
      /* not empty: reported by the caller's leftover check */
    }
  }
  // runsc keeps an nsfs bind mount of an empty netns in its root; drop it with the root.
  const nullNetns = path.join(runscRoot, 'null-netns');
  if (fs.existsSync(nullNetns) && (await isMounted(nullNetns))) {
    const u = await run('umount', [nullNetns]);
    if (u.code !== 0) await run('umount', ['-l', nullNetns]);
  }
  fs.rmSync(runscRoot, { recursive: true, force: true });
  try {
    fs.rmdirSync(workRoot);
  } catch {
    /* leftovers: reported by the caller */
  }
}

let current = null;
const isMain = process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url);
for (const sig of isMain ? ['SIGINT', 'SIGTERM'] : []) {
  process.once(sig, async () => {
    console.error(`\n${sig}: tearing down the current iteration`);
    if (current) await teardown(current).catch((err) => console.error(err.message));
    process.exit(130);
  });
}

async function main() {
  prepareRoot();
  const runMs = []; // runsc run --detach + exec true
  const bootMs = []; // runsc run --detach
  const execMs = []; // first runsc exec true
  const setupMs = []; // overlay + netns + config.json
  const fullMs = []; // setup + run
  for (let i = 0; i < warmup + n; i++) {
    const id = `vbench-${process.pid}-${i}`;
    const it = { id, dir: path.join(workRoot, id), netns: id };
    current = it;
    try {
      const t0 = now();
      await setup(it);
      const t1 = now();
      const tStarted = await bootAndExec(it);
      const t2 = now();
      if (i >= warmup) {
        setupMs.push(t1 - t0);
        runMs.push(t2 - t1);
        bootMs.push(tStarted - t1);
        execMs.push(t2 - tStarted);
        fullMs.push(t2 - t0);
        process.stderr.write(`  [runtime] ${i - warmup + 1}/${n}: run+exec ${(t2 - t1).toFixed(1)} ms (run ${(tStarted - t1).toFixed(1)}, exec ${(t2 - tStarted).toFixed(1)}; setup ${(t1 - t0).toFixed(1)})\n`);
      }
    } finally {
      await teardown(it);
      current = null;
    }
  }
  await cleanupRoot();
  writeJson(args.out, {
    phase: 'runtime',
    n,
    warmup,
    runsc: runscPath,
    runscFlags: runscFlags.map((f) => f.replace(runscRoot, '<root>')),
    configFrom: captured ? `vmon sandbox ${captured.sandboxId}'s config.json` : 'built-in (same shape as spec.go)',
    init: ['/bin/sleep', 'infinity'],
    samplesMs: { run: runMs, boot: bootMs, exec: execMs, setup: setupMs, full: fullMs },
    run: stats(runMs),
    boot: stats(bootMs),
    exec: stats(execMs),
    setup: stats(setupMs),
    full: stats(fullMs),
  });
}

if (isMain) {
  try {
    await main();
  } catch (err) {
    console.error(`runtime: ${err.stack || err}`);
    process.exit(1);
  }
}
