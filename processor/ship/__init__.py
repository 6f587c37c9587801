"""``processor ship``: follow the runtime's session files and produce their events.

Modules: :mod:`.layout` (where the runtime keeps sessions), :mod:`.reader`
(complete records of one growing file), :mod:`.registry` (acknowledged
positions in SQLite), :mod:`.sender` (the producer side), :mod:`.follow` (the
loop) and :mod:`.metrics`.  See docs/shipping.md.
"""
