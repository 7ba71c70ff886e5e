"""Housekeeping: what expired, and what crashed requests left behind, cleared every ``PERIOD`` seconds.

It runs in every server process, leader or follower (``server.py`` starts it), on the loop-service base without a
leadership: each sweep removes only what is old enough that no live request can still use it, so two processes
sweeping at once remove nothing twice that matters. The nonce purge and the storage sweeps fail apart: the database
briefly down must not keep the store from being swept, nor the reverse.
"""

from __future__ import annotations

import logging

from dlcloud.control.loop_service import LoopService
from dlcloud.services.auth import purge_nonces
from dlcloud.services.code import sweep_upload_scratch
from dlcloud.services.datasets import sweep_abandoned_pushes
from dlcloud.services.uploads import sweep_uploads

log = logging.getLogger(__name__)
PERIOD = 60.0  # seconds between two rounds
LEFT_BEHIND_SECONDS = 24 * 3600.0  # what crashed writes left in the store and the scratch directory goes after this


class Housekeeping(LoopService):
    name = "housekeeping"

    def interval(self) -> float:
        return PERIOD

    def tick(self) -> None:
        settings = self.p.settings
        try:
            purge_nonces(self.p.db, settings.clock_skew_seconds)
        except Exception:  # keep housekeeping alive across transient database errors
            log.exception("nonce purge failed")
        try:  # uploads no request used, and the claims of pushes that died, past their time
            self.p.objects.sweep(LEFT_BEHIND_SECONDS)
            sweep_upload_scratch(settings, LEFT_BEHIND_SECONDS)
            sweep_abandoned_pushes(self.p.db, self.p.objects, settings.model_upload_ttl_seconds)
            sweep_uploads(self.p.objects, settings.model_upload_ttl_seconds)
        except Exception:  # keep housekeeping alive across transient storage errors
            log.exception("storage sweep failed")
