"""What tests, the demo and the benchmark start: the Temporal dev server,
the codec server, workers (``local_stack``) and the scripted
OpenAI-compatible model server (``scripted_model``)."""
