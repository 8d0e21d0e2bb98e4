"""Publishing: model cards filled from the real model and run, and pushes to the Hub."""
