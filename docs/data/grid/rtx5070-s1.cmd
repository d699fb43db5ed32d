/work/main/build/autocompress run --config /work/main/configs/experiments/rtx5070.cfg --seed 1 --out runs/grid/rtx5070-s1
