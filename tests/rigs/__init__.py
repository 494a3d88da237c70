"""The test rig: what many test modules need, written once.

- ``folders``: short temporary folders (a run's plane socket lives in its folder, and a Unix socket path holds
  at most 107 bytes); ``tests/conftest.py`` serves one as the ``short_tmp`` fixture.
- ``scripted``: a reply of the scripted provider that calls one tool (``tool_call``).
- ``network``: a free loopback port; an ``http.server`` handler served on one (``http_server``).
- ``upstream``: a model provider on loopback that answers or drops each call as the test says.
- ``swarm_files``: one-lens swarm files, on the scripted provider (``scripted_swarm``; ``scripted_run`` writes
  the replies too, and prices the models or scores the run where asked) or on an upstream (``upstream_swarm``).

The ``bwrap`` mark is the rig's too: ``tests/conftest.py`` skips a test that carries it where bubblewrap is not
installed, so a module says ``pytest.mark.bwrap`` and nothing else.
"""
