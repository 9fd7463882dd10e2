"""Worker processes of the front: spawning, supervision, health probes, the UDS/TCP client."""
