"""Scale-out on Ray (the `ray` extra): batch jobs on Ray Data (`batch`, `encdec batch`) and the
HTTP server on Ray Serve (`serve`, `encdec serve --ray`). Ray is imported only by these modules,
never by the engine."""
