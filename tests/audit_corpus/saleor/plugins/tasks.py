"""Two of Saleor's tasks at 723cd4eb, options only (saleor/plugins/avatax/tasks.py:15-19 and
saleor/checkout/tasks.py:207-211); the bodies are stubs."""

from __future__ import annotations

from typing import Any, cast

from tests.audit_corpus.saleor import settings
from tests.audit_corpus.saleor.celeryconf import app


class TaxError(Exception):
    pass


@app.task(name="saleor.plugins.avatax.tasks.api_post_request_task", autoretry_for=(TaxError,), retry_backoff=30,
          retry_kwargs={"max_retries": 5})
def api_post_request_task(transaction_url: str, data: dict[str, Any], config: dict[str, Any], order_id: str) -> None: ...


@app.task(name="saleor.checkout.tasks.automatic_checkout_completion_task",
          queue=cast(str, settings.AUTOMATIC_CHECKOUT_COMPLETION_QUEUE_NAME),  # None unless the environment names one bind=True, default_retry_delay=60,
          retry_kwargs={"max_retries": 5})
def automatic_checkout_completion_task(self: Any, checkout_pk: str) -> None: ...
