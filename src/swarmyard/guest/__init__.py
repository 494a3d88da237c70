"""What runs inside a machine: its init (in Python, and in C in ``init.c``), the relay to the control plane, and
the Landlock, seccomp and noexec confinement the init applies, with the frames its control socket speaks.

Standard library only, and nothing of swarmyard outside this package: the init starts with ``python -I -S`` and
this package alone on its path. The host side (``swarmyard.machines``) imports these modules too, to build what
the init reads (the seccomp filter, the frames) and to probe the kernel; they never import the host's.
"""
