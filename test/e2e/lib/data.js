// Data helpers: large payloads generated and hashed chunk by chunk, so that a
// 100 MiB transfer never sits in the test process's memory.

import crypto from 'node:crypto';

export const MiB = 1024 * 1024;

/**
 * A ReadableStream of `size` random bytes, hashed as it is produced.
 * `digest()` gives the SHA-256 hex once the stream has been fully read.
 */
export function randomStream(size, chunkSize = 256 * 1024) {
  const hash = crypto.createHash('sha256');
  let sent = 0;
  let hex = null;
  const stream = new ReadableStream({
    pull(controller) {
      if (sent >= size) {
        hex = hash.digest('hex');
        controller.close();
        return;
      }
      const n = Math.min(chunkSize, size - sent);
      const chunk = crypto.randomFillSync(new Uint8Array(n));
      hash.update(chunk);
      sent += n;
      controller.enqueue(chunk);
    },
  });
  return {
    stream,
    sent: () => sent,
    digest: () => {
      if (hex === null) throw new Error(`stream not fully consumed (${sent}/${size} bytes sent)`);
      return hex;
    },
  };
}

/** Read a (web or node) stream to its end; returns { bytes, sha256 } without keeping the data. */
export async function hashStream(stream) {
  const hash = crypto.createHash('sha256');
  let bytes = 0;
  for await (const chunk of stream) {
    const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    hash.update(buf);
    bytes += buf.length;
  }
  return { bytes, sha256: hash.digest('hex') };
}

export function sha256(data) {
  return crypto.createHash('sha256').update(data).digest('hex');
}

/** Every byte value, repeated: catches text decoding or newline mangling of binary data. */
export function allBytes(repeat = 4) {
  const out = new Uint8Array(256 * repeat);
  for (let i = 0; i < out.length; i++) out[i] = i % 256;
  return out;
}
