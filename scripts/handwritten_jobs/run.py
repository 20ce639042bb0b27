"""Capture the hand-written jobs of job.py (tests/data/handwritten): each rank on gloo/loopback, its torch
pickle, JSON dump and faulthandler stacks written when the controller sees every rank's progress stand
still for 3 s (a hang) or every rank at its end (a run), the truth written beside them.
Usage: python run.py [JOB...]   (OUT: where to write, default ./captures; PORT_BASE: the first job's port,
default 29700; TORCH: a torch version for every job named, instead of each job's own; torch venvs from
scripts/torch-venv, the project's .venv for 2.13)"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
OUT = Path(os.environ.get("OUT", "captures"))
ROOT = HERE.parents[1]
JOBS = {
    # name: (scenario, ws, torch, category, culprits, mode, extra)
    "pp_stage_hang-ws4": ("pp_stage_hang", 4, "2.14.1", "hung_in_python", [2], "hang", {}),
    "grid_crash-ws8": ("grid_crash", 8, "2.14.1", "rank_crash", [5], "hang", {}),
    "moe_a2a_hang-ws4": ("moe_a2a_hang", 4, "2.14.1", "hung_in_python", [3], "hang", {}),
    "slow_node-ws8": ("slow_node", 8, "2.14.1", "straggler", [6, 7], "run", {"at": 25}),
    "object_hang_rank0-ws4": ("object_hang_rank0", 4, "2.15.0", "hung_in_python", [0], "hang", {}),
    "healthy_uneven-ws5": ("healthy_uneven", 5, "2.14.1", "healthy", [], "run", {"at": 12}),
    "healthy_pipeline-ws4": ("healthy_pipeline", 4, "2.14.1", "healthy", [], "run", {"at": 12}),
    "nested_hang-ws8": ("nested_hang", 8, "2.13", "hung_in_python", [4], "hang", {}),
    "crash_with_dump-ws4": ("crash_with_dump", 4, "2.14.1", "rank_crash", [1], "hang", {}),
    "ckpt_barrier_hang-ws6": ("ckpt_barrier_hang", 6, "2.14.1", "hung_in_python", [0], "hang", {}),
    "rs_dtype-ws4": ("rs_dtype", 4, "2.14.1", "dtype_mismatch", [1], "hang", {}),
    "two_hangs-ws8": ("two_hangs", 8, "2.14.1", "hung_in_python", [1, 6], "hang", {}),
    "async_bucket_hang-ws4": ("async_bucket_hang", 4, "2.15.0", "hung_in_python", [2], "hang", {}),
    "healthy_slow_steps-ws4": ("healthy_slow_steps", 4, "2.14.1", "healthy", [], "run", {}),
    "ddp_forward_hang-ws4": ("ddp_forward_hang", 4, "2.15.0", "hung_in_python", [1], "hang", {}),
    "ddp_crash-ws4": ("ddp_crash", 4, "2.14.1", "rank_crash", [2], "hang", {}),
    "fsdp_hang-ws4": ("fsdp_hang", 4, "2.15.0", "hung_in_python", [3], "hang", {}),
    "healthy_ddp-ws4": ("healthy_ddp", 4, "2.13", "healthy", [], "run", {}),
    "uneven_data-ws4": ("uneven_data", 4, "2.14.1", "collective_type_mismatch", [2], "hang", {}),
    "loader_hang-ws4": ("loader_hang", 4, "2.14.1", "hung_in_python", [0], "hang", {}),
    "two_rank_straggler-ws2": ("two_rank_straggler", 2, "2.15.0", "straggler", [1], "run", {}),
    "subgroup_size_mismatch-ws4": ("subgroup_size_mismatch", 4, "2.14.1", "size_mismatch", [3], "hang", {}),
    "mesh3d_crash-ws8": ("mesh3d_crash", 8, "2.15.0", "rank_crash", [6], "hang", {}),
    "hang_timeout_dumps-ws4": ("hang_timeout_dumps", 4, "2.14.1", "hung_in_python", [2], "hang", {}),
    "object_bcast_hang-ws4": ("object_bcast_hang", 4, "2.13", "hung_in_python", [3], "hang", {}),
    "hang-ws2": ("hang_ws2", 2, "2.14.1", "hung_in_python", [0], "hang", {}),
    "order_inversion-ws4": (
        "order_inversion",
        4,
        "2.14.1",
        "healthy",
        [],
        "hang",
        {},
    ),  # no cycle on this layout: it runs to its end
    "op_mismatch-ws4": ("op_mismatch", 4, "2.15.0", "collective_type_mismatch", [2], "hang", {}),
    "dtype_mismatch-ws4": ("dtype_mismatch", 4, "2.14.1", "dtype_mismatch", [3], "hang", {}),
    "tp_skip-ws8": ("tp_skip", 8, "2.14.1", "skipped_collective", [5], "hang", {}),
    "rank0_exception-ws6": ("rank0_exception", 6, "2.15.0", "rank_crash", [0], "hang", {}),
    "big_hang-ws16": ("big_hang", 16, "2.14.1", "hung_in_python", [13], "hang", {}),
    "healthy_async-ws4": ("healthy_async", 4, "2.15.0", "healthy", [], "run", {}),
    "straggler_jitter-ws4": ("straggler_jitter", 4, "2.13", "straggler", [2], "run", {}),
    # the second batch (batch2.py)
    "rs_size-ws6": ("rs_size", 6, "2.15.0", "size_mismatch", [4], "hang", {}),
    "ag_size-ws4": ("ag_size", 4, "2.13", "size_mismatch", [1], "hang", {}),
    "bcast_root_hang-ws6": ("bcast_root_hang", 6, "2.15.0", "hung_in_python", [3], "hang", {}),
    "subgroups_hang-ws6": ("subgroups_hang", 6, "2.13", "hung_in_python", [4], "hang", {}),
    "a2a_splits-ws4": ("a2a_splits", 4, "2.14.1", "size_mismatch", [1], "hang", {}),
    "gather_nonroot_hang-ws4": ("gather_nonroot_hang", 4, "2.15.0", "hung_in_python", [3], "hang", {}),
    "scatter_root_hang-ws4": ("scatter_root_hang", 4, "2.13", "hung_in_python", [2], "hang", {}),
    "early_exit-ws6": ("early_exit", 6, "2.15.0", "skipped_collective", [5], "hang", {}),
    "sigkill_async-ws8": ("sigkill_async", 8, "2.14.1", "rank_crash", [6], "hang", {}),
    "stale_other-ws6": ("stale_other", 6, "2.13", "hung_in_python", [4], "hang", {}),
    "async_unwaited-ws4": ("async_unwaited", 4, "2.15.0", "hung_in_python", [2], "hang", {}),
    "straggler_one_of_6-ws6": ("straggler_one_of_6", 6, "2.14.1", "straggler", [3], "run", {}),
    # gloo records no send/recv: only the live stacks can show it
    "p2p_wrong_peer-ws4": (
        "p2p_wrong_peer", 4, "2.13", "p2p_mismatch", [1], "hang", {"decidable_from": ["snap"]}
    ),
    "strided12_hang-ws12": ("strided12_hang", 12, "2.15.0", "hung_in_python", [9], "hang", {}),
    # DTensor's first redistribute imports for seconds: a longer stall before the capture
    "dtensor_hang-ws4": ("dtensor_hang", 4, "2.15.0", "hung_in_python", [1], "hang", {"stall_s": 12}),
    "dcp_save_stuck-ws4": ("dcp_save_stuck", 4, "2.13", "hung_in_python", [2], "hang", {}),
    "healthy_eval-ws4": ("healthy_eval", 4, "2.15.0", "healthy", [], "run", {}),
    "healthy_objects-ws4": ("healthy_objects", 4, "2.13", "healthy", [], "run", {}),
    "healthy_ddp_unused-ws4": ("healthy_ddp_unused", 4, "2.14.1", "healthy", [], "run", {}),
    # the third batch (batch3.py)
    "noncontig_hang-ws6": ("noncontig_hang", 6, "2.13", "hung_in_python", [2], "hang", {}),
    "overlap_families-ws8": ("overlap_families", 8, "2.14.1", "hung_in_python", [5], "hang", {}),
    "world_idle_hang-ws6": ("world_idle_hang", 6, "2.15.0", "hung_in_python", [4], "hang", {}),
    "async_two_groups_hang-ws6": ("async_two_groups_hang", 6, "2.13", "hung_in_python", [3], "hang", {}),
    "healthy_moe_uneven-ws6": ("healthy_moe_uneven", 6, "2.14.1", "healthy", [], "run", {}),
    "stale_crash-ws5": ("stale_crash", 5, "2.15.0", "rank_crash", [3], "hang", {}),
    "healthy_compute_pause-ws4": ("healthy_compute_pause", 4, "2.13", "healthy", [], "hang", {}),
    "healthy_grad_accum-ws6": ("healthy_grad_accum", 6, "2.14.1", "healthy", [], "run", {}),
    "reduce_root_stuck-ws5": ("reduce_root_stuck", 5, "2.15.0", "hung_in_python", [3], "hang", {}),
    "bcast_obj_barrier-ws6": ("bcast_obj_barrier", 6, "2.13", "hung_in_python", [4], "hang", {}),
    "nested_subgroups-ws12": ("nested_subgroups", 12, "2.14.1", "hung_in_python", [6], "hang", {}),
    "straggler_rank0-ws3": ("straggler_rank0", 3, "2.15.0", "straggler", [0], "run", {}),
    "slow_tp_node-ws6": ("slow_tp_node", 6, "2.13", "straggler", [3, 4, 5], "run", {}),
    "healthy_three_groups_async-ws6": ("healthy_three_groups_async", 6, "2.14.1", "healthy", [], "run", {}),
    "crash_in_subgroup-ws5": ("crash_in_subgroup", 5, "2.15.0", "rank_crash", [4], "hang", {}),
    "sub_dtype-ws5": ("sub_dtype", 5, "2.13", "dtype_mismatch", [4], "hang", {}),
    "a2a_uneven_mismatch-ws5": ("a2a_uneven_mismatch", 5, "2.14.1", "size_mismatch", [3], "hang", {}),
    "ddp_subgroup_hang-ws6": ("ddp_subgroup_hang", 6, "2.14.1", "hung_in_python", [4], "hang", {}),
    "ckpt_thread_hang-ws4": ("ckpt_thread_hang", 4, "2.15.0", "hung_in_python", [2], "hang", {}),
    "local_sync_hang-ws8": ("local_sync_hang", 8, "2.13", "hung_in_python", [3], "hang", {}),
    "sub_op_mismatch-ws6": ("sub_op_mismatch", 6, "2.14.1", "collective_type_mismatch", [4], "hang", {}),
    "tp1_hang-ws4": ("tp1_hang", 4, "2.15.0", "hung_in_python", [2], "hang", {}),
    "healthy_tp1-ws5": ("healthy_tp1", 5, "2.13", "healthy", [], "run", {}),
    "object_pickle_hang-ws5": ("object_pickle_hang", 5, "2.14.1", "hung_in_python", [4], "hang", {}),
    "error_flag_mismatch-ws4": ("error_flag_mismatch", 4, "2.13", "collective_type_mismatch", [1], "hang", {}),
    "intermittent_straggler-ws4": ("intermittent_straggler", 4, "2.15.0", "straggler", [3], "run", {}),
    "sub_timeout-ws6": ("sub_timeout", 6, "2.14.1", "hung_in_python", [1], "hang", {}),
    # the ranks wait on the work objects batch_isend_irecv returned: their stacks hold no torch frame (they
    # read as ranks in Python) and gloo records no send/recv: no form tells it from two ranks stuck in Python
    "batch_ring_wrong_peer-ws6": (
        "batch_ring_wrong_peer", 6, "2.15.0", "p2p_mismatch", [2], "hang", {"decidable_from": []}
    ),
    # new_group records nothing: only the live stacks show the ranks waiting in it
    "lazy_group_hang-ws5": (
        "lazy_group_hang", 5, "2.13", "hung_in_python", [1], "hang", {"decidable_from": ["snap"]}
    ),
    # the fourth batch (batch4.py)
    "fsdp1_fwd_hang-ws4": ("fsdp1_fwd_hang", 4, "2.13", "hung_in_python", [2], "hang", {}),
    "zero_step_hang-ws4": ("zero_step_hang", 4, "2.14.1", "hung_in_python", [1], "hang", {}),
    "a2a_list_hang-ws4": ("a2a_list_hang", 4, "2.15.0", "hung_in_python", [3], "hang", {}),
    "rs_list_hang-ws6": ("rs_list_hang", 6, "2.13", "hung_in_python", [3], "hang", {}),
    "ag_list_size-ws6": ("ag_list_size", 6, "2.14.1", "size_mismatch", [2], "hang", {}),
    "gather_root_abort-ws5": ("gather_root_abort", 5, "2.15.0", "rank_crash", [2], "hang", {}),
    "thread_groups_hang-ws4": ("thread_groups_hang", 4, "2.14.1", "hung_in_python", [1], "hang", {}),
    "destroy_early-ws4": ("destroy_early", 4, "2.15.0", "skipped_collective", [3], "hang", {}),
    "ddp_static_hook_hang-ws4": ("ddp_static_hook_hang", 4, "2.15.0", "hung_in_python", [2], "hang", {}),
    # every rank waits in the schedule's batched send/recv, which gloo does not record: only live stacks show it
    "pp_1f1b_hang-ws4": (
        "pp_1f1b_hang", 4, "2.14.1", "hung_in_python", [2], "hang", {"decidable_from": ["snap"], "stall_s": 6}
    ),
    "sampler_bcast_hang-ws4": ("sampler_bcast_hang", 4, "2.13", "hung_in_python", [1], "hang", {}),
    "grid_sub_straggler-ws8": ("grid_sub_straggler", 8, "2.14.1", "straggler", [5], "run", {}),
    "healthy_variable_steps-ws6": ("healthy_variable_steps", 6, "2.15.0", "healthy", [], "run", {}),
    # healthy, but its recorders are a straggler's: rank 0 late 300 ms at every 4th collective while the others do
    # nothing before it is what a rank with a slow loader every third step leaves (v1's straggler-ws2/ws4: the
    # others do no work between steps either; batch 3's intermittent straggler), and no recorder keeps a root
    "healthy_rank0_eval-ws4": ("healthy_rank0_eval", 4, "2.13", "healthy", [], "run", {"decidable_from": []}),
    "local_sync_3d_hang-ws12": ("local_sync_3d_hang", 12, "2.14.1", "hung_in_python", [7], "hang", {}),
    "exit0_no_dump-ws4": ("exit0_no_dump", 4, "2.15.0", "skipped_collective", [2], "hang", {}),
    "sigkill_in_agit-ws6": ("sigkill_in_agit", 6, "2.13", "rank_crash", [3], "hang", {}),
    "master_killed-ws6": ("master_killed", 6, "2.14.1", "rank_crash", [0], "hang", {}),
    "tp_autograd_hang-ws4": ("tp_autograd_hang", 4, "2.15.0", "hung_in_python", [1], "hang", {}),
    "healthy_ddp_join-ws4": ("healthy_ddp_join", 4, "2.14.1", "healthy", [], "run", {}),
    "replica_exit_hang-ws6": ("replica_exit_hang", 6, "2.13", "hung_in_python", [1], "hang", {}),
    "healthy_two_world_groups-ws4": ("healthy_two_world_groups", 4, "2.15.0", "healthy", [], "run", {}),
    "dcp_async_hang-ws4": ("dcp_async_hang", 4, "2.15.0", "hung_in_python", [2], "hang", {}),
    # the fifth batch (batch5.py): torch's libraries and launchers
    "hsdp_backward_hang-ws4": ("hsdp_backward_hang", 4, "2.15.0", "hung_in_python", [2], "hang", {"stall_s": 8}),
    "fsdp_tp_hang-ws4": ("fsdp_tp_hang", 4, "2.14.1", "hung_in_python", [1], "hang", {"stall_s": 8}),
    "healthy_fsdp_tp-ws4": ("healthy_fsdp_tp", 4, "2.13", "healthy", [], "run", {}),
    "funcol_hang-ws4": ("funcol_hang", 4, "2.15.0", "hung_in_python", [3], "hang", {"stall_s": 10}),
    "compiled_funcol_hang-ws4": ("compiled_funcol_hang", 4, "2.13", "hung_in_python", [2], "hang", {"stall_s": 20}),
    "healthy_compiled_funcol-ws4": ("healthy_compiled_funcol", 4, "2.14.1", "healthy", [], "run", {}),
    "dcp_async_stuck-ws4": ("dcp_async_stuck", 4, "2.15.0", "hung_in_python", [1], "hang", {"stall_s": 6}),
    "dcp_load_hang-ws4": ("dcp_load_hang", 4, "2.13", "hung_in_python", [2], "hang", {"stall_s": 6}),
    # pipelining's p2p is not recorded: only the live stacks show the stage that holds the schedule
    "interleaved_pp_hang-ws2": (
        "interleaved_pp_hang", 2, "2.14.1", "hung_in_python", [1], "hang", {"stall_s": 6, "decidable_from": ["snap"]}
    ),
    "looped_bfs_hang-ws3": (
        "looped_bfs_hang", 3, "2.15.0", "hung_in_python", [0], "hang", {"stall_s": 6, "decidable_from": ["snap"]}
    ),
    "fsdp_clip_skip-ws4": ("fsdp_clip_skip", 4, "2.14.1", "collective_type_mismatch", [1], "hang", {"stall_s": 6}),
    "loader_worker_crash-ws4": ("loader_worker_crash", 4, "2.13", "rank_crash", [2], "hang", {}),
    # monitored_barrier is p2p on gloo (not recorded): the waits show in the live stacks only
    "monitored_two_stuck-ws6": (
        "monitored_two_stuck", 6, "2.15.0", "hung_in_python", [1, 4], "hang", {"decidable_from": ["snap"]}
    ),
    "healthy_hsdp-ws4": ("healthy_hsdp", 4, "2.14.1", "healthy", [], "run", {}),
    "loss_parallel_hang-ws4": ("loss_parallel_hang", 4, "2.13", "hung_in_python", [2], "hang", {"stall_s": 10}),
    "healthy_ddp_bn_uneven_accum-ws4": ("healthy_ddp_bn_uneven_accum", 4, "2.13", "healthy", [], "run", {}),
    "ddp_straggler-ws4": ("ddp_straggler", 4, "2.14.1", "straggler", [1], "run", {}),
    # under torchrun (agents started by the controller)
    "two_agents_slow_node-ws4": ("two_agents_slow_node", 4, "2.15.0", "straggler", [2, 3], "run", {"nodes": 2}),
    "two_agents_slow_node-ws6": ("two_agents_slow_node", 6, "2.13", "straggler", [3, 4, 5], "run", {"nodes": 2}),
    "two_agents_node_lost-ws4": (
        "two_agents_node_lost", 4, "2.14.1", "rank_crash", [2, 3], "hang", {"nodes": 2, "kill_node_at": "4"}
    ),
    "record_crash-ws4": ("record_crash", 4, "2.15.0", "rank_crash", [1], "hang", {"nodes": 1}),
    # under torch.multiprocessing.spawn
    "spawn_hang-ws3": ("spawn_hang", 3, "2.15.0", "hung_in_python", [1], "hang", {"launcher": "spawn"}),
    "two_agents_mesh_hang-ws8": ("two_agents_mesh_hang", 8, "2.13", "hung_in_python", [6], "hang", {"nodes": 2}),
    # group [1, 3] holds rank 3's gather (its "tp") and rank 1's sum (its "dp"); rank 2 waits for 3 in [2, 3]
    "mesh_names_swapped-ws4": (
        "mesh_names_swapped", 4, "2.14.1", "collective_type_mismatch", [3], "hang", {"stall_s": 10}
    ),
}


def _venv(version):
    # --check: a missing venv is an error here, never a build (`scripts/torch-venv VERSION` builds one)
    return subprocess.run(
        [str(ROOT / "scripts" / "torch-venv"), "--check", version], check=True, capture_output=True, text=True
    ).stdout.split()[-1]


PY = {"2.13": str(ROOT / ".venv" / "bin" / "python")}


def _env(out, **more):
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        JOB_OUT=str(out),
        TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
        TORCH_FR_BUFFER_SIZE="2000",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        **more,
    )
    env.pop("PYTHONPATH", None)
    return env


def _rank(scen, ws, py, port, out, log, r):
    env = _env(out, RANK=str(r), WORLD_SIZE=str(ws), LOCAL_RANK=str(r), MASTER_PORT=str(port))
    return subprocess.Popen([py, str(HERE / "job.py"), scen], env=env, stdout=log, stderr=log, start_new_session=True)


def _agents(name, scen, ws, py, port, out, log, extra):
    # torchrun agents (nodes) on loopback with a c10d rendezvous; the first hosts the store
    nodes = extra["nodes"]
    procs = []
    for node in range(nodes):
        cmd = [py, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={ws // nodes}",
               "--max-restarts=0", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={name}", "--monitor-interval=0.5",
               f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}", str(HERE / "job.py"), scen]
        procs.append(subprocess.Popen(cmd, env=_env(out), stdout=log, stderr=log, start_new_session=True))
        time.sleep(1.0)
    return procs


def _pids(out, ws):
    # each rank's pid and its parent's (its launcher's), from the pid file it writes at its start
    got = {}
    for r in range(ws):
        try:
            pid, ppid = (out / f"pid_{r}").read_text().split()
            got[r] = (int(pid), int(ppid))
        except (OSError, ValueError):
            pass
    return got


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def run(name, port):
    scen, ws, tv, cat, culprits, mode, extra = JOBS[name]
    tv = os.environ.get("TORCH", tv)  # the same job on another torch
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    log = open(out / "job.log", "w")
    py = PY.get(tv) or _venv(tv)
    if "nodes" in extra:
        procs = _agents(name, scen, ws, py, port, out, log, extra)
    elif extra.get("launcher") == "spawn":
        env = _env(out, WORLD_SIZE=str(ws), MASTER_PORT=str(port))
        procs = [subprocess.Popen([py, str(HERE / "spawn_job.py"), scen], env=env, stdout=log, stderr=log,
                                  start_new_session=True)]
    else:
        procs = [_rank(scen, ws, py, port, out, log, r) for r in range(ws)]
    t0 = time.time()
    killed = False
    last = {}
    still = time.time()
    while True:
        time.sleep(0.25)
        prog = {}
        for r in range(ws):
            try:
                prog[r] = (OUT / name / f"prog_{r}").read_text()
            except OSError:
                prog[r] = None
        if mode == "run":
            if all(v == "end" for v in prog.values()):
                time.sleep(0.5)
                break
            if time.time() - t0 > 150:
                print(name, "no end")
                break
            continue
        if "kill_node_at" in extra and not killed:
            lost = range(ws - ws // extra["nodes"], ws)
            if all(prog.get(r) == extra["kill_node_at"] for r in lost):
                pids = _pids(out, ws)
                for r in lost:
                    os.kill(pids[r][0], signal.SIGKILL)
                os.kill(pids[lost[0]][1], signal.SIGKILL)  # the node's agent
                killed = True
        if prog != last:
            last, still = prog, time.time()
        if prog and all(v is not None for v in prog.values()) and time.time() - still > extra.get("stall_s", 3):
            break
        if time.time() - t0 > 120:
            print(name, "no stall")
            break
    trig = time.time_ns()
    (out / "trigger").write_text("go")
    if "nodes" in extra or "launcher" in extra:
        alive = [r for r, (pid, _) in _pids(out, ws).items() if _alive(pid)]
    else:
        alive = [r for r, p in enumerate(procs) if p.poll() is None]
    dl = time.time() + 90
    while time.time() < dl and not all((out / f"done_{r}").exists() for r in alive):
        time.sleep(0.1)
    answered = [r for r in alive if (out / f"done_{r}").exists()]
    ranks = _pids(out, ws)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for pid, _ in ranks.values():  # a launcher's ranks may run in sessions of their own
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    # each rank's dumps were taken when it wrote them (captured_<r>: a periodic, end-of-run or error-path
    # dump is older than the trigger)
    taken = {r: int((out / f"captured_{r}").read_text()) for r in range(ws) if (out / f"captured_{r}").exists()}
    # Stacks are read live, from the processes there at the capture (as a sidecar or py-spy reads them): a rank
    # that died before it leaves its dumps, never a stack (the one its faulthandler wrote beside an earlier
    # dump would read as alive at the capture).
    # A live rank that did not answer the trigger (stuck holding the GIL) has no live stack either: what it
    # left is from before.
    for r in range(ws):
        if r not in answered:
            (out / f"rank_{r}.stack.txt").unlink(missing_ok=True)
    marks = [p for mark in ("prog_*", "done_*", "pid_*", "captured_*") for p in out.glob(mark)]
    for f in marks + [out / "trigger"]:
        f.unlink(missing_ok=True)
    truth = {
        "category": cat,
        "culprit_ranks": culprits,
        "world_size": ws,
        "torch": tv,
        "dumps": {str(r): {"capture_t_ns": taken.get(r, trig)} for r in range(ws)},
        "alive_at_capture": alive,
        **{k: v for k, v in extra.items() if k == "decidable_from"},
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    print(
        name,
        "alive",
        alive,
        "files",
        sorted(p.name for p in out.glob("rank_*.pkl")),
        f"{time.time() - t0:.0f}s",
        flush=True,
    )


if __name__ == "__main__":
    names = sys.argv[1:] or list(JOBS)
    for i, n in enumerate(names):
        run(n, int(os.environ.get("PORT_BASE", "29700")) + i)
