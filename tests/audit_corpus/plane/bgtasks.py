"""Two of Plane's tasks at 4ca6d6c7 (apps/api/plane/bgtasks/email_notification_task.py:46 and :152), plain
shared tasks; the bodies are stubs."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="plane.bgtasks.email_notification_task.stack_email_notification")
def stack_email_notification() -> None: ...


@shared_task(name="plane.bgtasks.email_notification_task.send_email_notification")
def send_email_notification(issue_id: str, notification_data: object, receiver_id: str,
                            email_notification_ids: list[str]) -> None: ...
