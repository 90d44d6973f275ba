"""Operating deepthread: health checks, Prometheus metrics and the small HTTP server that serves both."""
