"""The rule for a host without a working sandbox: it runs only one tenant's code.

Without bubblewrap (or with user namespaces disallowed) every job, build and inspection runs as the control
plane's own user and could read every other tenant's data and the server's secrets. Such a server runs
code for its bootstrap tenant only, unless its operator opted out with ``--allow-unsandboxed-tenants``
(docs/isolation.md says what that gives away).
"""

from __future__ import annotations

from dlcloud.errors import PermissionDenied
from dlcloud.services.auth import Caller
from dlcloud.services.platform import Platform


def require_isolation(platform: Platform, caller: Caller, what: str) -> None:
    """Refuse ``what`` (e.g. "running jobs") for tenants other than the bootstrap one on an unsandboxed host."""
    if platform.isolated or platform.settings.allow_unsandboxed_tenants:
        return
    if caller.tenant == platform.settings.bootstrap_tenant_name:
        return
    raise PermissionDenied(
        f"this server runs user code without a sandbox ({platform.isolation or 'no sandbox'}), so {what} is "
        f"allowed only for tenant {platform.settings.bootstrap_tenant_name!r}; the operator must install "
        "bubblewrap (or allow user namespaces) or start dlcloud up with --allow-unsandboxed-tenants",
        code="isolation_unavailable",
    )
