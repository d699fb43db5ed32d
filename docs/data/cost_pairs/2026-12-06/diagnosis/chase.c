// Pointer chase over an old buffer (allocated at start) and a freshly mapped one, every 3 s.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#define N (32u<<20)  /* 32M pointers * 8 B = 256 MiB */
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint64_t rng=88172645463325252ull; static uint64_t xr(){rng^=rng<<13;rng^=rng>>7;rng^=rng<<17;return rng;}
static size_t* make(){size_t*a=mmap(0,N*8,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 size_t* perm=malloc(N*8); for(size_t i=0;i<N;i++)perm[i]=i; for(size_t i=N-1;i>0;i--){size_t j=xr()%(i+1);size_t t=perm[i];perm[i]=perm[j];perm[j]=t;}
 for(size_t i=0;i<N;i++)a[perm[i]]=perm[(i+1)%N]; free(perm); return a;}
static double chase(size_t*a){size_t p=0;double t0=now();for(int i=0;i<2000000;i++)p=a[p];double t=now()-t0; if(p==12345678901)puts("x");return t/2e6*1e9;}
int main(int c,char**v){int secs=atoi(v[1]);size_t*old=make();double t0=now();
 while(now()-t0<secs){size_t*fresh=make(); double o1=chase(old),f=chase(fresh),o2=chase(old);
  printf("%6.1f s old %.0f ns fresh %.0f ns old %.0f ns\n",now()-t0,o1,f,o2);fflush(stdout);munmap(fresh,N*8);sleep(2);}
}
