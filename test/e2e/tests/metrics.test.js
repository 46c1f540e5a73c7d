// Metrics and probes of a real vmon serve: /healthz and /readyz on the API listener, and the
// Prometheus endpoint on --metrics-listen, whose counters move as the SDK makes, pauses and
// resumes sandboxes. (The Go tests read the same output with Prometheus's own text parser.)
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Sandbox } from 'e2b';
import { useServer, runId, killQuietly, scrapeMetrics } from '../lib/harness.js';

const METRICS = '127.0.0.1:19464';

const scrape = () => scrapeMetrics(`http://${METRICS}/metrics`);

describe('metrics and probes', () => {
  const srv = useServer({ name: 'metrics', args: ['--metrics-listen', METRICS] });
  const RUN = runId('metrics');
  const created = [];
  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
  });

  srv.test('the API listener answers /healthz and /readyz without a key; the metrics listener too', async () => {
    for (const base of [srv.apiUrl, `http://${METRICS}`]) {
      const h = await fetch(`${base}/healthz`);
      assert.equal(h.status, 200);
      const r = await fetch(`${base}/readyz`);
      assert.equal(r.status, 200, await r.clone().text());
      assert.equal(await r.text(), 'ready\n');
    }
  });

  srv.test('counters and histograms move as sandboxes are made, paused and resumed', async () => {
    const before = await scrape();
    const at = (s, k) => s[k] ?? 0;
    const a = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
    const b = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(a, b);
    assert.equal(await a.pause(), true);
    await Sandbox.connect(a.sandboxId, srv.sdkOpts);
    const after = await scrape();
    assert.equal(at(after, 'vmon_sandboxes_created_total{template="base"}') - at(before, 'vmon_sandboxes_created_total{template="base"}'), 2);
    assert.equal(at(after, 'vmon_sandbox_operations_total{op="create",outcome="ok"}') - at(before, 'vmon_sandbox_operations_total{op="create",outcome="ok"}'), 2);
    assert.equal(at(after, 'vmon_sandbox_create_duration_seconds_count') - at(before, 'vmon_sandbox_create_duration_seconds_count'), 2);
    assert.equal(at(after, 'vmon_sandbox_pause_duration_seconds_count') - at(before, 'vmon_sandbox_pause_duration_seconds_count'), 1);
    assert.ok(at(after, 'vmon_sandbox_resume_duration_seconds_count') - at(before, 'vmon_sandbox_resume_duration_seconds_count') >= 1);
    assert.ok(at(after, 'vmon_sandbox_create_duration_seconds_sum') > at(before, 'vmon_sandbox_create_duration_seconds_sum'));
    assert.ok(at(after, 'vmon_sandboxes{state="running",template="base"}') >= 2, JSON.stringify(after));
    assert.ok(at(after, 'vmon_node_sandboxes_running') >= 2);
    assert.ok(at(after, 'vmon_node_free_memory_bytes') > 0);
    assert.equal(after['vmon_info{role="all"}'], 1);
    // The egress proxy's relay counters exist (the test's sandboxes reach no origin).
    for (const dir of ['sent', 'received']) assert.ok(after[`vmon_egress_proxy_bytes_total{direction="${dir}"}`] >= 0, dir);
    // The records' database: statements ran for those creates, and took some time.
    assert.ok(at(after, 'vmon_database_queries_total{engine="sqlite"}') - at(before, 'vmon_database_queries_total{engine="sqlite"}') >= 4);
    assert.ok(at(after, 'vmon_database_query_seconds_total{engine="sqlite"}') > at(before, 'vmon_database_query_seconds_total{engine="sqlite"}'));
    assert.ok(at(after, 'go_goroutines') > 0);
  });
});
