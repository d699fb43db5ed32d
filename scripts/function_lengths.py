#!/usr/bin/env python3
"""The longest top-level functions of the library folders (issue 33 measure).

usage: function_lengths.py ROOT [N]   prints the N longest (default 15) and how many are over 150 lines.
A function is counted from its first line at column 0 to the closing brace at column 0.
"""
import os, re, sys
root = sys.argv[1]
res = []
for top in ['launcher','dist','model','data','checkpoint','job','distill','search','eval','bench']:
    for dp, _, fs in os.walk(os.path.join(root, top)):
        for f in fs:
            if not f.endswith('.cpp'): continue
            p = os.path.join(dp, f); L = open(p, errors='replace').read().split('\n')
            i = 0
            while i < len(L):
                l = L[i]
                if l and not l[0].isspace() and not l.startswith(('//','#','}','namespace','using','struct','class','enum','template','typedef','static_assert')) and '(' in l:
                    # find opening brace at depth: line ending with '{' within next 6 lines
                    j = i
                    while j < len(L) and j < i + 8 and not L[j].rstrip().endswith('{'):
                        if L[j].rstrip().endswith(';'): j = len(L); break
                        j += 1
                    if j < len(L) and j < i + 8:
                        k = j + 1
                        while k < len(L) and not L[k].startswith('}'): k += 1
                        name = re.match(r'.*?([A-Za-z_:~0-9]+)\s*\(', l)
                        res.append((k - i + 1, os.path.relpath(p, root), name.group(1) if name else l[:40]))
                        i = k
                i += 1
res.sort(reverse=True)
over = [r for r in res if r[0] > 150]
for r in res[:int(sys.argv[2]) if len(sys.argv) > 2 else 15]: print(*r)
print('functions over 150 lines:', len(over))
