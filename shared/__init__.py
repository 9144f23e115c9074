"""The fixes: small primitives a production codebase can take as they are.

One primitive per module, its knobs and limits in its docstring:
``envelope`` (FM-1, ``@enveloped`` and ``Result``), ``dlq`` (FM-3, the quorum
queue's dead-letter path and its drain), ``claim`` (FM-4, one email per pipeline),
``retry`` (FM-5, ``@transient_retryable``), ``timeouts`` (FM-6, ``@hard_timeout``).
Nothing here imports the lab (``lab/``); the lab imports these.
"""
