#!/usr/bin/env bash
# Stop the daemons started by .ci/slurm-up.sh, by their pid files (reverse order).
for f in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
  [ -s "$f" ] || continue
  P=$(cat "$f")
  kill "$P" 2>/dev/null || continue
  for _ in $(seq 1 100); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$P" 2>/dev/null; then echo "slurm-down: $f pid $P still alive" >&2; else echo "slurm-down: stopped $f ($P)"; fi
done
