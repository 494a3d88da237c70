"""The test rig: what many test modules need, written once.

- ``folders``: short temporary folders (a run's plane socket lives in its folder, and a Unix socket path holds
  at most 107 bytes); ``tests/conftest.py`` serves one as the ``short_tmp`` fixture.
- ``scripted``: a reply of the scripted provider that calls one tool (``tool_call``).
- ``chat``: a scripted chat model for the built-in agent run in the test's process (``ScriptedChat``), and an
  evaluator stand-in that scores from a table (``TableScorer``).
- ``cli``: the CLI in a subprocess with a small environment of its own (``run_cli``, ``cli_env``).
- ``network``: a free loopback port; an ``http.server`` handler served on one (``http_server``); an asyncio
  connection handler served on one (``stream_server``: an upstream written on the bare socket).
- ``upstream``: a model provider on loopback that answers or drops each call as the test says.
- ``swarm_files``: one-lens swarm files, on the scripted provider (``scripted_swarm``; ``scripted_run`` writes
  the replies too, and prices the models or scores the run where asked) or on an upstream (``upstream_swarm``);
  a built-in worker and lead looking around their machine (``machine_swarm``).
- ``demo``: the README's grounded demo on the scripted provider, run through the CLI (``demo_swarm``,
  ``run_demo``), and what the plane refused its agents.
- ``model_runs``: a CLI run on the embedded model to its end, stopped only when it stops making progress
  (``run_while_progressing``), and the environment it gets (``model_env``: no key, the assembled model linked).

The ``bwrap`` mark is the rig's too: ``tests/conftest.py`` skips a test that carries it where bubblewrap is not
installed, so a module says ``pytest.mark.bwrap`` and nothing else.
"""
