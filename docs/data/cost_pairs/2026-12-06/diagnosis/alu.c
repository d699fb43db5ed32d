#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double clk(int id){struct timespec t;clock_gettime(id,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint64_t rng=88172645463325252ull; static uint64_t xr(){rng^=rng<<13;rng^=rng>>7;rng^=rng<<17;return rng;}
int main(int c,char**v){int secs=atoi(v[1]); size_t n=(4u<<20)/8; size_t*a=malloc(n*8); size_t*perm=malloc(n*8);
 for(size_t i=0;i<n;i++)perm[i]=i; for(size_t i=n-1;i>0;i--){size_t j=xr()%(i+1);size_t t=perm[i];perm[i]=perm[j];perm[j]=t;} for(size_t i=0;i<n;i++)a[perm[i]]=perm[(i+1)%n];
 double T0=clk(CLOCK_MONOTONIC);
 while(clk(CLOCK_MONOTONIC)-T0<secs){
  double w0=clk(CLOCK_MONOTONIC),c0=clk(CLOCK_PROCESS_CPUTIME_ID); volatile uint64_t x=1; uint64_t y=1; for(long i=0;i<200000000;i++) y=y*6364136223846793005ull+1442695040888963407ull; x=y;
  double w1=clk(CLOCK_MONOTONIC),c1=clk(CLOCK_PROCESS_CPUTIME_ID); size_t p=0; for(int i=0;i<5000000;i++)p=a[p]; if(p==7)puts("");
  double w2=clk(CLOCK_MONOTONIC),c2=clk(CLOCK_PROCESS_CPUTIME_ID);
  printf("%5.0f alu wall %.3f cpu %.3f | l3chase %.1f ns (cpu %.1f)\n",w0-T0,w1-w0,c1-c0,(w2-w1)/5e6*1e9,(c2-c1)/5e6*1e9); fflush(stdout);}
}
