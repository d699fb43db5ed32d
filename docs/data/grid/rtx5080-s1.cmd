/work/main/build/autocompress run --config /work/main/configs/experiments/rtx5080.cfg --seed 1 --out runs/grid/rtx5080-s1
