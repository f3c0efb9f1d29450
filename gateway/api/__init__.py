"""The small HTTP API toolkit every component uses: JSON errors, the route guard, typed
application state and the readiness registry."""
