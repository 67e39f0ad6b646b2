# Sourced by the planned calls that profile under Nsight Compute (call_u.sh, call_v.sh), after
# script_env.sh: NCU names its command line, and its version goes to $OUT; without one the call
# stops with exit status 3.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then
  echo "no ncu on this machine" | tee "$OUT/ncu_missing.txt"
  exit 3
fi
"$NCU" --version > "$OUT/ncu_version.txt" 2>&1
