// files.*: read/write in every format, list with depth, stat, exists, mkdir,
// rename, remove, watch, signed upload/download URLs, and a 100 MiB file
// streamed both ways without the server holding it.

import assert from 'node:assert/strict';
import { describe } from 'node:test';
import {
  Sandbox,
  FileType,
  FilesystemEventType,
  FileNotFoundError,
  NotFoundError,
  InvalidArgumentError,
} from 'e2b';
import { useServer, runId, killQuietly, waitFor, sleep } from '../lib/harness.js';
import { MiB, randomStream, hashStream, sha256, allBytes } from '../lib/data.js';

// Hooks live inside describe(): Node 20 does not await root-level hooks in order.
describe('files', () => {
  const srv = useServer({ name: 'files' });
  const RUN = runId('files');
  let sbx;
  let other; // second sandbox, for signed-URL routing

  srv.before(async () => {
    [sbx, other] = await Promise.all([
      Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, role: 'main' } }),
      Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, role: 'other' } }),
    ]);
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, sbx, other);
  });

  const H = '/home/user';

  srv.test('write and read text', async () => {
    const text = `héllo wörld ✓ ${RUN}\nsecond line\n`;
    const info = await sbx.files.write(`${H}/hello.txt`, text);
    assert.equal(info.path, `${H}/hello.txt`);
    assert.equal(info.name, 'hello.txt');
    assert.equal(info.type, FileType.FILE);
    assert.equal(await sbx.files.read(`${H}/hello.txt`), text);
    // the guest sees the same bytes
    const r = await sbx.commands.run(`sha256sum ${H}/hello.txt | cut -d' ' -f1`);
    assert.equal(r.stdout.trim(), sha256(text));
    // overwrite truncates
    await sbx.files.write(`${H}/hello.txt`, 'short');
    assert.equal(await sbx.files.read(`${H}/hello.txt`), 'short');
    // relative paths resolve against the user's home; parents are created
    const rel = await sbx.files.write('rel/dir/rel.txt', 'relative');
    assert.equal(rel.path, `${H}/rel/dir/rel.txt`);
    assert.equal(await sbx.files.read(`${H}/rel/dir/rel.txt`), 'relative');
    assert.equal(await sbx.files.read('rel/dir/rel.txt'), 'relative');
    // empty file
    await sbx.files.write(`${H}/empty.txt`, '');
    assert.equal(await sbx.files.read(`${H}/empty.txt`), '');
  });

  srv.test('write and read bytes in every format', async () => {
    const data = allBytes(8);
    await sbx.files.write(`${H}/bytes.bin`, data);
    const bytes = await sbx.files.read(`${H}/bytes.bin`, { format: 'bytes' });
    assert.ok(bytes instanceof Uint8Array, 'bytes format gives a Uint8Array');
    assert.deepEqual(Buffer.from(bytes), Buffer.from(data));

    const blob = await sbx.files.read(`${H}/bytes.bin`, { format: 'blob' });
    assert.ok(blob instanceof Blob);
    assert.equal(blob.size, data.length);
    assert.deepEqual(Buffer.from(await blob.arrayBuffer()), Buffer.from(data));

    const stream = await sbx.files.read(`${H}/bytes.bin`, { format: 'stream' });
    const got = await hashStream(stream);
    assert.deepEqual(got, { bytes: data.length, sha256: sha256(data) });

    // ArrayBuffer and Blob inputs, and the octet-stream upload path
    await sbx.files.write(`${H}/ab.bin`, data.buffer.slice(0, 300));
    assert.deepEqual(Buffer.from(await sbx.files.read(`${H}/ab.bin`, { format: 'bytes' })), Buffer.from(data.subarray(0, 300)));
    await sbx.files.write(`${H}/blob.bin`, new Blob([data]), { useOctetStream: true });
    assert.equal(sha256(await sbx.files.read(`${H}/blob.bin`, { format: 'bytes' })), sha256(data));
    await sbx.files.write(`${H}/gz.bin`, new Blob([data]), { gzip: true });
    assert.equal(sha256(await sbx.files.read(`${H}/gz.bin`, { format: 'bytes', gzip: true })), sha256(data));

    const r = await sbx.commands.run(`sha256sum ${H}/bytes.bin | cut -d' ' -f1`);
    assert.equal(r.stdout.trim(), sha256(data));
  });

  srv.test('reading a missing file → FileNotFoundError', async () => {
    await assert.rejects(sbx.files.read(`${H}/no-such-file-e2e`), FileNotFoundError);
    await assert.rejects(sbx.files.read(`${H}/no-such-file-e2e`, { format: 'stream' }), FileNotFoundError);
  });

  srv.test('write an array of files', async () => {
    const res = await sbx.files.write([
      { path: `${H}/multi/a.txt`, data: 'A' },
      { path: `${H}/multi/deep/b.txt`, data: 'BB' },
      { path: `${H}/multi/c.bin`, data: allBytes(1) },
    ]);
    assert.ok(Array.isArray(res));
    assert.deepEqual(res.map((w) => w.path), [`${H}/multi/a.txt`, `${H}/multi/deep/b.txt`, `${H}/multi/c.bin`]);
    assert.equal(await sbx.files.read(`${H}/multi/a.txt`), 'A');
    assert.equal(await sbx.files.read(`${H}/multi/deep/b.txt`), 'BB');
    assert.equal(sha256(await sbx.files.read(`${H}/multi/c.bin`, { format: 'bytes' })), sha256(allBytes(1)));
  });

  srv.test('files written as root are owned by root; as user by user', async () => {
    await sbx.files.write('/root/e2e-root.txt', 'r', { user: 'root' });
    const st = await sbx.files.getInfo('/root/e2e-root.txt', { user: 'root' });
    assert.equal(st.owner, 'root');
    assert.equal(await sbx.files.read('/root/e2e-root.txt', { user: 'root' }), 'r');
    // As E2B's envd does, uploads are written by envd and handed to the requesting user, even
    // where that user could not write itself.
    await sbx.files.write('/root/e2e-user.txt', 'u');
    assert.equal((await sbx.files.getInfo('/root/e2e-user.txt', { user: 'root' })).owner, 'user');
    // relative paths resolve against the chosen user's home
    const w = await sbx.files.write('rel-root.txt', 'x', { user: 'root' });
    assert.equal(w.path, '/root/rel-root.txt');
  });

  srv.test('list with depth', async () => {
    const T = `${H}/tree`;
    await sbx.files.write([
      { path: `${T}/a.txt`, data: 'a' },
      { path: `${T}/sub1/b.txt`, data: 'b' },
      { path: `${T}/sub1/sub2/c.txt`, data: 'c' },
    ]);
    await sbx.files.makeDir(`${T}/z-dir`);

    const paths = (entries) => entries.map((e) => e.path).sort();
    const d1 = await sbx.files.list(T);
    assert.deepEqual(paths(d1), [`${T}/a.txt`, `${T}/sub1`, `${T}/z-dir`]);
    const a = d1.find((e) => e.name === 'a.txt');
    assert.equal(a.type, FileType.FILE);
    assert.equal(a.size, 1);
    assert.equal(d1.find((e) => e.name === 'sub1').type, FileType.DIR);

    assert.deepEqual(paths(await sbx.files.list(T, { depth: 1 })), paths(d1));
    const d2 = await sbx.files.list(T, { depth: 2 });
    assert.deepEqual(paths(d2), [`${T}/a.txt`, `${T}/sub1`, `${T}/sub1/b.txt`, `${T}/sub1/sub2`, `${T}/z-dir`]);
    const b = d2.find((e) => e.path === `${T}/sub1/b.txt`);
    assert.equal(b.name, 'b.txt', 'name is the base name');
    const d3 = await sbx.files.list(T, { depth: 3 });
    assert.deepEqual(paths(d3), [
      `${T}/a.txt`,
      `${T}/sub1`,
      `${T}/sub1/b.txt`,
      `${T}/sub1/sub2`,
      `${T}/sub1/sub2/c.txt`,
      `${T}/z-dir`,
    ]);
    assert.deepEqual(paths(await sbx.files.list('tree', { depth: 10 })), paths(d3), 'relative path, depth past the bottom');

    await assert.rejects(sbx.files.list(`${H}/no-such-dir-e2e`), NotFoundError);
    await assert.rejects(sbx.files.list(`${T}/a.txt`), InvalidArgumentError);
  });

  srv.test('getInfo (stat) and exists', async () => {
    const before = Date.now();
    await sbx.files.write(`${H}/stat.txt`, '12345');
    const st = await sbx.files.getInfo(`${H}/stat.txt`);
    assert.equal(st.name, 'stat.txt');
    assert.equal(st.path, `${H}/stat.txt`);
    assert.equal(st.type, FileType.FILE);
    assert.equal(st.size, 5);
    assert.equal(st.mode, 0o644, `mode ${st.mode.toString(8)}`);
    assert.equal(st.permissions, '-rw-r--r--');
    assert.equal(st.owner, 'user');
    assert.equal(st.group, 'user');
    assert.ok(st.modifiedTime instanceof Date, 'modifiedTime is a date');
    assert.ok(Math.abs(st.modifiedTime.getTime() - before) < 120_000, `modifiedTime ${st.modifiedTime.toISOString()} is recent`);

    const dir = await sbx.files.getInfo(H);
    assert.equal(dir.type, FileType.DIR);
    assert.equal(dir.name, 'user');
    assert.equal(dir.owner, 'user');
    assert.match(dir.permissions, /^d/);

    assert.equal(await sbx.files.exists(`${H}/stat.txt`), true);
    assert.equal(await sbx.files.exists(H), true);
    assert.equal(await sbx.files.exists(`${H}/no-such-file-e2e`), false);
    await assert.rejects(sbx.files.getInfo(`${H}/no-such-file-e2e`), FileNotFoundError);
  });

  srv.test('makeDir: true when created, false when it exists', async () => {
    assert.equal(await sbx.files.makeDir(`${H}/newdir/a/b`), true);
    assert.equal(await sbx.files.makeDir(`${H}/newdir/a/b`), false);
    assert.equal(await sbx.files.makeDir(`${H}/newdir`), false);
    const st = await sbx.files.getInfo(`${H}/newdir/a/b`);
    assert.equal(st.type, FileType.DIR);
    assert.equal(st.mode, 0o755, `mode ${st.mode.toString(8)}`);
    assert.equal(st.owner, 'user', 'parents and dir are owned by the user');
    assert.equal((await sbx.files.getInfo(`${H}/newdir/a`)).owner, 'user');
  });

  srv.test('rename and remove', async () => {
    await sbx.files.write(`${H}/mv-src.txt`, 'moving');
    const moved = await sbx.files.rename(`${H}/mv-src.txt`, `${H}/mv-dst.txt`);
    assert.equal(moved.path, `${H}/mv-dst.txt`);
    assert.equal(moved.name, 'mv-dst.txt');
    assert.equal(moved.type, FileType.FILE);
    assert.equal(await sbx.files.exists(`${H}/mv-src.txt`), false);
    assert.equal(await sbx.files.read(`${H}/mv-dst.txt`), 'moving');
    await assert.rejects(sbx.files.rename(`${H}/mv-src.txt`, `${H}/x.txt`), NotFoundError);

    await sbx.files.makeDir(`${H}/mv-dir/inner`);
    await sbx.files.write(`${H}/mv-dir/inner/f.txt`, 'f');
    const dirMoved = await sbx.files.rename(`${H}/mv-dir`, `${H}/mv-dir2`);
    assert.equal(dirMoved.type, FileType.DIR);
    assert.equal(await sbx.files.read(`${H}/mv-dir2/inner/f.txt`), 'f');

    await sbx.files.remove(`${H}/mv-dst.txt`);
    assert.equal(await sbx.files.exists(`${H}/mv-dst.txt`), false);
    await sbx.files.remove(`${H}/mv-dir2`); // recursive
    assert.equal(await sbx.files.exists(`${H}/mv-dir2`), false);
    await sbx.files.remove(`${H}/never-existed-e2e`); // not an error
  });

  srv.test('watchDir: recursive events for writes, creates and removes', async () => {
    const W = `${H}/watched`;
    await sbx.files.makeDir(`${W}/sub`);
    await sbx.files.write(`${W}/top.txt`, 'v1');
    const events = [];
    const handle = await sbx.files.watchDir(W, (e) => events.push(e), { recursive: true, timeoutMs: 0 });
    const show = () => JSON.stringify(events.map((e) => [e.type, e.name]));
    try {
      await sbx.files.write(`${W}/top.txt`, 'v2');
      await waitFor(() => events.some((e) => e.name === 'top.txt' && e.type === FilesystemEventType.WRITE), {
        timeoutMs: 10_000,
        what: 'WRITE event for top.txt',
      });
      await sbx.files.write(`${W}/sub/nested.txt`, 'n');
      await waitFor(
        () => events.some((e) => e.name === 'sub/nested.txt' && [FilesystemEventType.CREATE, FilesystemEventType.WRITE].includes(e.type)),
        { timeoutMs: 10_000, what: 'event for sub/nested.txt (recursive)' },
      );
      await sbx.commands.run(`rm ${W}/top.txt`);
      await waitFor(() => events.some((e) => e.name === 'top.txt' && e.type === FilesystemEventType.REMOVE), {
        timeoutMs: 10_000,
        what: 'REMOVE event for top.txt',
      });
    } catch (err) {
      err.message += `\nevents seen: ${show()}`;
      throw err;
    } finally {
      await handle.stop();
    }
  });

  srv.test('watchDir: non-recursive watch ignores nested changes; missing dir → not found', async () => {
    const W = `${H}/watched-flat`;
    await sbx.files.makeDir(`${W}/sub`);
    const events = [];
    const handle = await sbx.files.watchDir(W, (e) => events.push(e));
    try {
      await sbx.files.write(`${W}/sub/deep.txt`, 'deep');
      await sbx.files.write(`${W}/flat.txt`, 'flat');
      await waitFor(() => events.some((e) => e.name === 'flat.txt'), { timeoutMs: 10_000, what: 'event for flat.txt' });
      await sleep(500);
      assert.ok(!events.some((e) => e.name.includes('deep.txt')), `no nested events: ${JSON.stringify(events)}`);
    } finally {
      await handle.stop();
    }
    await assert.rejects(sbx.files.watchDir(`${H}/no-such-dir-e2e`, () => {}), NotFoundError);
  });

  srv.test('signed download/upload URLs work with plain fetch and no headers', async () => {
    await sbx.files.write(`${H}/signed.txt`, `signed-${RUN}`);
    const dl = await sbx.downloadUrl(`${H}/signed.txt`);
    const u = new URL(dl);
    assert.ok(u.searchParams.get('signature')?.startsWith('v1_'), `signed URL: ${dl}`);
    assert.equal(u.searchParams.get('path'), `${H}/signed.txt`);
    let res = await fetch(dl);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), `signed-${RUN}`);

    // upload with a path
    const ul = await sbx.uploadUrl(`${H}/uploaded.txt`);
    const form = new FormData();
    form.append('file', new Blob([`uploaded-${RUN}`]), 'uploaded.txt');
    res = await fetch(ul, { method: 'POST', body: form });
    assert.equal(res.status, 200, await res.clone().text());
    const body = await res.json();
    assert.ok(Array.isArray(body) && body[0].path === `${H}/uploaded.txt`, JSON.stringify(body));
    assert.equal(await sbx.files.read(`${H}/uploaded.txt`), `uploaded-${RUN}`);

    // upload without a path: the multipart filename carries it
    const ul2 = await sbx.uploadUrl();
    const form2 = new FormData();
    form2.append('file', new Blob(['no-path-upload']), `${H}/up-nopath/f.txt`);
    res = await fetch(ul2, { method: 'POST', body: form2 });
    assert.equal(res.status, 200, await res.clone().text());
    assert.equal(await sbx.files.read(`${H}/up-nopath/f.txt`), 'no-path-upload');

    // with an expiration
    const exp = await sbx.downloadUrl(`${H}/signed.txt`, { useSignatureExpiration: 120 });
    assert.ok(new URL(exp).searchParams.get('signature_expiration'), 'expiration in URL');
    res = await fetch(exp);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), `signed-${RUN}`);

    // as another user
    await sbx.files.write('/root/signed-root.txt', 'root-only', { user: 'root' });
    const rootUrl = await sbx.downloadUrl('/root/signed-root.txt', { user: 'root' });
    res = await fetch(rootUrl);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), 'root-only');
  });

  srv.test('bad, tampered, expired or misused signatures → 401', async () => {
    const dl = await sbx.downloadUrl(`${H}/signed.txt`);
    const expect401 = async (url, init, what) => {
      const res = await fetch(url, init);
      const text = await res.text();
      assert.equal(res.status, 401, `${what}: got ${res.status} ${text}`);
      assert.doesNotMatch(text, new RegExp(`signed-${RUN}`), `${what}: no content leaks`);
    };

    const tampered = new URL(dl);
    const sig = tampered.searchParams.get('signature');
    tampered.searchParams.set('signature', sig.slice(0, -2) + (sig.endsWith('AA') ? 'BB' : 'AA'));
    await expect401(tampered, undefined, 'tampered signature');

    const otherPath = new URL(dl);
    otherPath.searchParams.set('path', `${H}/hello.txt`);
    await expect401(otherPath, undefined, 'signature for another path');

    const noSig = new URL(dl);
    noSig.searchParams.delete('signature');
    await expect401(noSig, undefined, 'no signature, no token');

    const expired = await sbx.downloadUrl(`${H}/signed.txt`, { useSignatureExpiration: -60 });
    await expect401(expired, undefined, 'expired signature');
    // The reason is told once the signature identified the sandbox, in header mode as in domain mode.
    assert.equal((await (await fetch(expired)).json()).message, 'signature is already expired');

    const extended = new URL(await sbx.downloadUrl(`${H}/signed.txt`, { useSignatureExpiration: 60 }));
    extended.searchParams.set('signature_expiration', String(Number(extended.searchParams.get('signature_expiration')) + 3600));
    await expect401(extended, undefined, 'expiration changed after signing');

    // a write signature is not a read signature
    const ul = await sbx.uploadUrl(`${H}/signed.txt`);
    await expect401(ul, undefined, 'upload URL used for a download');
    // and a read signature does not allow writing
    const form = new FormData();
    form.append('file', new Blob(['overwritten']), 'signed.txt');
    await expect401(dl, { method: 'POST', body: form }, 'download URL used for an upload');
    assert.equal(await sbx.files.read(`${H}/signed.txt`), `signed-${RUN}`, 'file untouched');
  });

  srv.test('signed URLs reach the sandbox they were signed for', async () => {
    await Promise.all([
      sbx.files.write(`${H}/same-path.txt`, 'from-main'),
      other.files.write(`${H}/same-path.txt`, 'from-other'),
    ]);
    const [a, b] = await Promise.all([sbx.downloadUrl(`${H}/same-path.txt`), other.downloadUrl(`${H}/same-path.txt`)]);
    assert.notEqual(a, b);
    assert.equal(await (await fetch(a)).text(), 'from-main');
    assert.equal(await (await fetch(b)).text(), 'from-other');
    const up = await other.uploadUrl(`${H}/only-in-other.txt`);
    const form = new FormData();
    form.append('file', new Blob(['other-upload']), 'only-in-other.txt');
    assert.equal((await fetch(up, { method: 'POST', body: form })).status, 200);
    assert.equal(await other.files.read(`${H}/only-in-other.txt`), 'other-upload');
    assert.equal(await sbx.files.exists(`${H}/only-in-other.txt`), false);
  });

  srv.test('a 100 MiB file streams up and down without the server buffering it', async () => {
    const SIZE = 100 * MiB;
    const P = `${H}/big.bin`;
    const peakBefore = srv.peakRss();

    const gen = randomStream(SIZE);
    const t0 = Date.now();
    const w = await sbx.files.write(P, gen.stream);
    const upMs = Date.now() - t0;
    assert.equal(w.path, P);
    assert.equal(gen.sent(), SIZE);
    const digest = gen.digest();

    const inGuest = await sbx.commands.run(`stat -c %s ${P}; sha256sum ${P} | cut -d' ' -f1`, { timeoutMs: 120_000 });
    assert.equal(inGuest.stdout, `${SIZE}\n${digest}\n`, 'the guest has exactly the bytes sent');

    const t1 = Date.now();
    const down = await hashStream(await sbx.files.read(P, { format: 'stream' }));
    const downMs = Date.now() - t1;
    assert.deepEqual(down, { bytes: SIZE, sha256: digest }, 'streamed download matches');

    const dl = await sbx.downloadUrl(P);
    const res = await fetch(dl);
    assert.equal(res.status, 200);
    assert.deepEqual(await hashStream(res.body), { bytes: SIZE, sha256: digest }, 'signed-URL download matches');

    const growth = srv.peakRss() - peakBefore;
    console.log(`# 100 MiB: up ${upMs} ms, down ${downMs} ms, vmon peak RSS growth ${(growth / MiB).toFixed(1)} MiB`);
    assert.ok(growth < 64 * MiB, `vmon's peak RSS grew by ${(growth / MiB).toFixed(1)} MiB while moving 100 MiB: it must stream, not buffer`);
    await sbx.files.remove(P);
    assert.equal(await sbx.files.exists(P), false);
  });
});
