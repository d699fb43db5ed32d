/work/main/build/autocompress run --config /work/main/configs/experiments/rtx5070.cfg --seed 2 --out runs/grid/rtx5070-s2
