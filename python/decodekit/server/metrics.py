"""Prometheus metrics of the server (`GET /metrics`), vLLM-style names under `decodekit:`.

Engine state (running / waiting requests, KV-cache usage, prefix-cache hit rate, preemptions,
token counters, speculative acceptance) is read at scrape time by a collector; request latencies
(TTFT, time per output token, inter-token latency, end-to-end, queue time) are histograms the
request handlers observe.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)


class _EngineCollector:
    def __init__(self, aeng, model_name: str):
        self.aeng, self.model = aeng, model_name

    def collect(self):
        eng = self.aeng.engine
        lab = ["model_name"]
        vals = [self.model]

        def gauge(name, doc, v):
            g = GaugeMetricFamily(f"decodekit:{name}", doc, labels=lab)
            g.add_metric(vals, float(v))
            return g

        def counter(name, doc, v):
            c = CounterMetricFamily(f"decodekit:{name}", doc, labels=lab)
            c.add_metric(vals, float(v))
            return c

        kv = eng.kv_manager
        yield gauge("num_requests_running", "Sequences in the running batch.", eng.scheduler.num_running)
        yield gauge("num_requests_waiting", "Sequences waiting to be scheduled.", self.aeng.num_waiting())
        yield gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).", kv.usage)
        yield gauge("prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / tokens looked up.",
                    kv.prefix_cache_hit_rate)
        yield counter("num_preemptions", "Sequences preempted (recomputed later).", eng.scheduler.num_preemptions)
        yield counter("prompt_tokens", "Prompt tokens of accepted requests.", eng.stats["prompt_tokens"])
        yield counter("generation_tokens", "Generated tokens.", eng.stats["generation_tokens"])
        yield counter("engine_steps", "Engine steps (forward passes) run.", eng.stats["steps"])
        yield gauge("engine_alive", "1 while the engine loop runs.", 1 if self.aeng.alive else 0)
        if eng.spec is not None:
            s = eng.spec.summary()
            yield counter("spec_decode_num_draft_tokens", "Draft tokens verified.", s["spec_draft_tokens"])
            yield counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.", s["spec_accepted_tokens"])
            yield gauge("spec_decode_acceptance_rate", "Accepted / drafted tokens.", s["spec_acceptance_rate"])
            yield gauge("spec_decode_mean_accepted_length", "Tokens emitted per verification step.",
                        s["spec_mean_accepted_length"])


class ServerMetrics:
    def __init__(self, aeng, model_name: str):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(aeng, model_name))
        self.model = model_name

        def hist(name, doc):
            return Histogram(f"decodekit:{name}", doc, ["model_name"], registry=self.registry,
                             buckets=_LATENCY_BUCKETS).labels(model_name)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token (server arrival to first token).")
        self.tpot = hist("time_per_output_token_seconds", "Mean time per output token after the first, per request.")
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive token deliveries of a request.")
        self.e2e = hist("e2e_request_latency_seconds", "Server arrival to the request's last token.")
        self.queue = hist("request_queue_time_seconds", "Arrival to first scheduling.")

    def observe_request(self, metrics: dict, n_tokens: int) -> None:
        """From a finished RequestOutput's metrics (monotonic times)."""
        a, f, e, s = (metrics.get(k) for k in ("arrival", "first_token", "finished", "first_scheduled"))
        if a is not None and f is not None:
            self.ttft.observe(max(f - a, 0.0))
        if a is not None and e is not None:
            self.e2e.observe(max(e - a, 0.0))
        if a is not None and s is not None:
            self.queue.observe(max(s - a, 0.0))
        if f is not None and e is not None and n_tokens > 1:
            self.tpot.observe(max(e - f, 0.0) / (n_tokens - 1))
