/work/main/build/autocompress run --config /work/main/configs/experiments/cpu-local.cfg --seed 2 --out runs/grid/cpu-local-s2
