# The job contract's rendezvous check (docs/job-spec.md#job-environment), run by the backend
# conformance tests and the end-to-end Slurm test: see RENDEZVOUS in conformance.rs.
import os, socket, sys, time
env = os.environ
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
if env["MERIDIAN_REPLICA"] != env["RANK"] or env["MERIDIAN_REPLICAS"] != env["WORLD_SIZE"]:
    sys.exit("the MERIDIAN_* and launcher variables disagree")
if env["MERIDIAN_COORDINATOR"] not in (f"{host}:{port}", f"[{host}]:{port}"):
    sys.exit("MERIDIAN_COORDINATOR is not MASTER_ADDR:MASTER_PORT")
node = env.get("SLURMD_NODENAME") or socket.gethostname()
who = f"rank {rank}/{world} of {env['MERIDIAN_JOB_ID']} on {env['MERIDIAN_CLUSTER']} node {node}"
if rank == 0:
    server = socket.create_server(("", port))
    server.settimeout(30)
    met = []
    for _ in range(world - 1):
        conn, _ = server.accept()
        with conn:
            met.append(conn.recv(256).decode())
            conn.sendall(f"welcome from {who}".encode())
    print(f"{who}: listening on {host}:{port}, met {sorted(met)}", flush=True)
else:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        conn.sendall(who.encode())
        reply = conn.recv(256).decode()
    print(f"{who}: reached {host}:{port}, heard {reply!r}", flush=True)
