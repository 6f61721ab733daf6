"""Read a broker's Prometheus endpoint (``metrics.port``) from tests.

``RequestCount`` counts one API's requests between two scrapes, so a client test can tell a
well-behaved consumer (a few Fetch requests a second: long polls, backoff after errors) from a
request storm (thousands a second) without timing anything else.
"""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import Broker


def metrics_url(broker: Broker) -> str:
    address = (broker.data_dir / "metrics-address").read_text().strip()
    return f"http://{address}/metrics"


def requests_of(broker: Broker, api: str) -> int:
    """``exactly_requests_total{api=...}`` now (0 before the first such request)."""
    with urllib.request.urlopen(metrics_url(broker), timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "exactly_requests_total" and sample.labels.get("api") == api:
                return int(sample.value)
    return 0


class RequestCount:
    """Requests of one API since ``start()`` and the seconds that took."""

    def __init__(self, broker: Broker, api: str = "Fetch") -> None:
        self.broker = broker
        self.api = api
        self._first = 0
        self._since = 0.0

    def start(self) -> RequestCount:
        self._first = requests_of(self.broker, self.api)
        self._since = time.monotonic()
        return self

    def so_far(self) -> tuple[int, float]:
        return requests_of(self.broker, self.api) - self._first, time.monotonic() - self._since

    def assert_no_storm(self, per_second: float = 20.0, slack: int = 20) -> None:
        """A consumer fetches a few times a second (fetch.wait.max.ms long polls, error backoff);
        the null-record-set bug made librdkafka send thousands a second."""
        count, seconds = self.so_far()
        bound = slack + per_second * seconds
        assert count <= bound, (
            f"{count} {self.api} requests in {seconds:.1f} s (bound {bound:.0f}): a request storm"
        )
