"""Code that runs *inside* a sandbox: the one-shot prelude, the warm fork server, the Docker
runner, the session child. The one in-sandbox runtime: every backend and mode sets its limits
with :func:`~agentrl.sandbox.guest.limits.apply_limits` (whose docstring says what each limit
means) and runs the code here.

The files of this package are the parts of one program, standard library only (no site-packages
needed, Python >= 3.9). The engine never imports them, except :mod:`~agentrl.sandbox.guest.wire`,
the wire format both sides share. :mod:`agentrl.sandbox._launch` joins the parts each mode needs
into one source text, dropping their docstrings and their imports of each other (in the program
they share one namespace), and hands it to the sandboxed interpreter as
``python -I -S -c <program> <mode> <config-json>``:

* :mod:`~agentrl.sandbox.guest.wire`: frames, tree channels, descriptor passing;
* :mod:`~agentrl.sandbox.guest.limits`: rlimits, cgroups, identity, the system-call filter;
* :mod:`~agentrl.sandbox.guest.execution`: running the code (every mode), and mode ``session``;
* :mod:`~agentrl.sandbox.guest.oneshot`: the one-shot bootstrap;
* :mod:`~agentrl.sandbox.guest.trees`: a warm server's execution trees (namespaces, each tree's init);
* :mod:`~agentrl.sandbox.guest.warm`: mode ``server``;
* :mod:`~agentrl.sandbox.guest.docker_runner`: modes ``runner`` and ``reaper``.

Host-side counterparts live in :mod:`agentrl.sandbox._tree` (bubblewrap, unsafe-local) and
:mod:`agentrl.sandbox.docker`.

The one-shot paths (bubblewrap's per-execution mode, unsafe-local ``run``) start a fresh
interpreter per execution; to keep that start fast they run only
:func:`~agentrl.sandbox.guest.oneshot.oneshot_prelude` and what it needs
(:data:`~agentrl.sandbox.guest.oneshot.ONESHOT_NAMES`), cut out of these files, rather than a
whole program.

Modes (``sys.argv[1]``):

``server`` (bubblewrap warm worker; runs as uid 0 of a user namespace of its own with
    ``CAP_SETUID``, ``CAP_SETGID``, ``CAP_SETFCAP``, ``CAP_SYS_ADMIN``, ``CAP_SYS_CHROOT`` and
    ``CAP_NET_ADMIN`` over its own namespaces only)
    First forks ``F``, the *init factory*, while it is still small; then imports the configured
    modules, runs the warm-up code, freezes the heap (``gc.freeze``), forks ``Z``, the *fork
    helper* (:func:`~agentrl.sandbox.guest.warm.fork_helper`), and answers requests on the
    control socket (fd from the config, ``SOCK_SEQPACKET``, frames; :class:`WarmServer
    <agentrl.sandbox.guest.warm.WarmServer>`):
    ``{"op": "take", "kind": "exec" | "session"}`` -> ``{"event": "tree", "pid": n}`` with two
    descriptors attached: the host's end of the new *tree*'s channel, a pidfd of the tree's
    init and (``exec``) a pidfd of its ``U``. ``exec`` trees are forked ahead of requests
    (``prefork`` of them are kept ready).

    A *tree* is: ``I``, forked by ``F`` (cheap: ``F`` is small), pid 1 of a fresh PID namespace
    with fresh mount and IPC namespaces (and a fresh network namespace, loopback only, for
    sessions), a fresh size-capped tmpfs on ``/tmp`` and ``/dev/shm`` and a ``/proc`` of its own;
    ``I`` reaps orphans and resets the tree on the server's request
    (:func:`~agentrl.sandbox.guest.trees.init_main`). And
    ``U``, forked by ``Z`` (a copy of the warm server that does nothing but fork, so that the
    server's own work between forks faults no copy-on-write pages and a ``U`` inherits none of
    its descriptors) into ``I``'s namespaces (``setns``), in a user namespace of its own (so that
    ``RLIMIT_NPROC`` counts the tree's processes only) as uid/gid 65534 with no capabilities,
    under the system-call filter, waiting for its request
    (:func:`~agentrl.sandbox.guest.warm.tree_process`). ``U`` runs the code, kills every other
    process of the tree, reports ``{"event": "exit", "status": ...}`` and exits; ``Z`` reaps it and the server reports its real status too (also when ``U`` died
    without reporting). Then, for an ``exec`` tree whose ``U`` exited by itself, the server waits
    until the host has closed the tree's channel (after which the host never signals that ``I``
    again), asks ``I`` to reset the tree and keeps it for a later ``exec`` tree (at most
    ``MAX_TREE_USES`` executions); otherwise, or if the reset fails, it SIGKILLs ``I``, which
    ends the namespace. The host kills a tree at its deadline by sending SIGKILL to ``I``
    through the pidfd.

``runner`` (Docker: started per execution or per session by ``docker exec`` as uid 0 with only
    ``CAP_SETUID``, ``CAP_SETGID``, ``CAP_KILL``)
    Reads framed requests on stdin, runs each in a child that drops to the sandbox uid, supervises
    it (deadline, output caps), kills every other process of the container afterwards, wipes the
    writable places (``/tmp``, ``/dev/shm``, ``/dev/mqueue``, System V IPC) and writes a framed
    result on stdout. ``mode`` ``oneshot``: one request, then exit; ``session``: cells in one
    interpreter until end of input.

``reaper`` (Docker: the container's PID 1)
    Drops to uid 65534 at once, then reaps orphans; not dumpable, so the code (same uid) cannot
    trace it.

``session`` (unsafe-local sessions)
    The ``U`` session loop alone, on a socket passed in the config, without namespaces.

Wire format: see :mod:`~agentrl.sandbox.guest.wire`.
"""
