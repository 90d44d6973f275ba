"""Operating deepthread: health checks, Prometheus metrics, the small HTTP server that serves both, and the run
context that tags log lines."""
