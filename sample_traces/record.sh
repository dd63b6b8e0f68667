#!/usr/bin/env bash
# Re-record every sample run (CPU, gloo). Run from the repository root after `make setup`.
set -euo pipefail
P=".venv/bin/pardiag profile"
# rec NAME SCRIPT NPROC [script args...]
rec() { local out=$1 script=$2 n=$3; shift 3; $P "$script" --nproc-per-node "$n" --out "sample_traces/$out" --overwrite -- "$@"; }
rec ddp_cpu_2rank            examples/train_ddp.py 2 --steps 6
rec fsdp2_cpu_2rank          examples/train_fsdp2.py 2 --steps 6
rec fsdp2_noreshard_cpu_2rank examples/train_fsdp2.py 2 --steps 6 --reshard-after-forward false
rec fsdp1_cpu_2rank          examples/train_fsdp1.py 2 --steps 6
rec zero1_cpu_2rank          examples/train_zero1.py 2 --steps 6
rec tp_sp_cpu_2rank          examples/train_tp.py 2 --steps 6
rec moe_ep_cpu_2rank         examples/train_moe.py 2 --steps 6
rec pp_gpipe_cpu_2rank       examples/train_pp.py 2 --steps 6 --schedule gpipe --microbatches 4
rec pp_1f1b_cpu_2rank        examples/train_pp.py 2 --steps 6 --schedule 1f1b --microbatches 8
rec pp_interleaved_cpu_2rank examples/train_pp.py 2 --steps 6 --schedule interleaved --microbatches 4
rec pp_1f1b_cpu_4rank        examples/train_pp.py 4 --steps 6 --schedule 1f1b --microbatches 8
rec fsdp_tp_2d_cpu_4rank     examples/train_2d.py 4 --steps 6
rec ddp_slowrank1_cpu_2rank  examples/train_ddp.py 2 --steps 6 --slow-rank 1 --slow-ms 20
rec pp_unbalanced_cpu_2rank examples/train_pp.py 2 --steps 20 --schedule 1f1b --microbatches 4 --layers-per-stage 1,5 --batch 128 --pin-cpu
# the demo's comparison (make demo: compare.html): the unbalanced pipeline, then, right after it, the
# same with that run's top recommendation applied (it was "microbatches 2"; check `pardiag report
# sample_traces/pp_before_cpu_2rank` and change the second line when it recommends something else)
rec pp_before_cpu_2rank     examples/train_pp.py 2 --steps 20 --schedule 1f1b --microbatches 4 --layers-per-stage 1,5 --batch 128 --pin-cpu
rec pp_after_cpu_2rank      examples/train_pp.py 2 --steps 20 --schedule 1f1b --microbatches 2 --layers-per-stage 1,5 --batch 128 --pin-cpu
