"""When ranks fail, hang or are told to stop: where each rank is and its small answering port (`liveness`), a
per-rank watchdog over its waits in collectives (`watchdog`), the ranks' agreement to stop on a signal or a
watchdog's verdict (`stopping`), and a launcher's SIGTERM held until a rank has checked its input
(`sigterm_hold`). `liveness`, `watchdog` and `sigterm_hold` import nothing outside this package; `stopping`
may also import `common.errors` and `common.loop.backend`. Never a backend or the comparison.
"""
