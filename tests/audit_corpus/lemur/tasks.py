"""Four of Lemur's tasks at 3a3c2c20 (lemur/common/celery.py lines 119, 233, 453, 1029), options only."""

from __future__ import annotations

from tests.audit_corpus.lemur.celery import celery_app


@celery_app.task(name="lemur.common.celery.report_celery_last_success_metrics")  # :119
def report_celery_last_success_metrics() -> None: ...


@celery_app.task(name="lemur.common.celery.fetch_acme_cert", soft_time_limit=600)  # :233
def fetch_acme_cert(id: int, notify_reissue_cert_id: int | None = None) -> None: ...


@celery_app.task(name="lemur.common.celery.clean_source", soft_time_limit=3600)  # :453
def clean_source(source: str) -> None: ...


@celery_app.task(name="lemur.common.celery.identity_expiring_deployed_certificates", soft_time_limit=10800)  # :1029
def identity_expiring_deployed_certificates() -> None: ...
