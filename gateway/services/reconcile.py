"""Quota reconciliation: refund each request's unused reservation from its usage record.

Every gateway subscribes to the usage topic in one shared group (`topics.streams.USAGE`), so
each record is reconciled once across the fleet; a record is committed after its refund (a
crash between the two refunds a record twice at worst, which only loosens a quota by one
request).
"""

from __future__ import annotations

from gateway.services.quota import QuotaService
from schemas.messages import UsageRecord


class UsageReconciler:
    def __init__(self, quota: QuotaService) -> None:
        self._quota = quota
        self.reconciled = 0

    async def handle(self, usage: UsageRecord) -> None:
        if usage.reserved_tokens:
            await self._quota.reconcile(usage)
        self.reconciled += 1
