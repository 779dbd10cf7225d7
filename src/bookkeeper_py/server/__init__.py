"""The bookie process: listener, request handlers, registration, lifecycle."""
