"""AutoRecovery (reference section 1.14): an elected auditor marks the ledgers of lost bookies
under-replicated; replication workers copy their missing entries to other bookies and swap them
into the metadata. ``replication`` holds the copying (also used by ``bookkeeper shell recover``
and ``decommissionbookie``), ``auditor`` and ``worker`` the two roles, ``service`` the process
that runs both."""
