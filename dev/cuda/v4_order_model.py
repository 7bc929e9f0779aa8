"""Models behind NOTES_attention.md's v4 variants (no GPU needed).

Default: a list-scheduling model of the fused backward's grid at the 100m shape (B=16, NKV=4, G=2,
32 tiles of 64; 264 slots = 2 blocks/SM on 132 SMs). A block = G*nq steps of Q ticks; the dQ add
at the end of a step waits until the chain predecessor's add of the same (head, q tile) is E ticks
old. Prints the makespan over the average slot load, the slot-time spent waiting, and how many
(b, kvh) groups are active at once (the L2 footprint).
--protocol: random interleavings of the lite kernel's per-warp turn protocol (barriers, deferred
releases, last-turn reset) for several shapes, residencies and CHAIN/TICK/LOCK combinations:
checks no deadlock, the add order of every (b, h, q tile, warp), counters back at 0.
"""
import random, sys
B,NKV,G,nkt,slots = 16,4,2,32,264
NG=B*NKV; Q=4
def tickets(order):
    if order=='jdesc':  return [(nkt-1-t//NG, t%NG) for t in range(NG*nkt)]
    if order=='jasc':   return [(t//NG, t%NG) for t in range(NG*nkt)]
    kind,S=order.split(':'); S=int(S); out=[]
    for g0 in range(0,NG,S):
        for jj in range(nkt):
            for g in range(g0,min(g0+S,NG)):
                out.append(((nkt-1-jj) if kind=='bdesc' else jj, g))
    return out
def visit(j,s,v):
    nq=nkt-j
    if v=='kmaj': return s//nq, j+s%nq
    return s%G, nkt-1-s//G
def run(order, dep, v, E):
    tk=tickets(order); nxt=0; active=[]; done={}
    t=0; idle=0; maxg=0; gsum=0
    while nxt<len(tk) or active:
        while len(active)<slots and nxt<len(tk):
            j,g=tk[nxt]; nxt+=1; active.append([j,g,0,0])  # j g step ticks-in-step
        gs=set(a[1] for a in active); maxg=max(maxg,len(gs)); gsum+=len(gs)
        fin=[]
        for a in active:
            j,g,s,q=a
            if q<Q-1: a[3]+=1; continue      # compute part of the step
            k,i=visit(j,s,v)
            if dep=='desc': pred=(g,j+1,k,i) if i>j else None
            elif dep=='asc': pred=(g,j-1,k,i) if j>0 else None
            else: pred=None
            if pred is None or done.get(pred,1e18)+E<=t:
                done[(g,j,k,i)]=t; a[2]+=1; a[3]=0
                if a[2]==G*(nkt-j): fin.append(a)
            else: idle+=1
        for a in fin: active.remove(a)
        t+=1
    W=sum(G*(nkt-j) for j,g in tk)*Q
    print(f"{order:9s} {dep:4s} {v:4s} E={E}: makespan +{100*(t*slots/W-1):5.1f}%  waiting {100*idle/W:4.1f}%  groups active max {maxg} mean {gsum/t:.1f}")

def protocol():
    def run(B,NKV,G,nkt,CHAIN,TICK,LOCK,R,seed):
        rnd=random.Random(seed); NG=B*NKV; NH=NKV*G; SB=TICK; nblk=NG*nkt
        cnt={}; order={}; ticket=[0]
        def mapping(tk):
            if TICK==0: return nkt-1-tk//NG, tk%NG    # kernel's TICK numbering: 0, 1, batches of TICK
            if TICK==1: return tk//NG, tk%NG
            g0=tk//(SB*nkt)*SB; sb=min(SB,NG-g0); r=tk-g0*nkt; return r//sb, g0+r%sb
        def block():
            tk=ticket[0]; ticket[0]+=1; j,grp=mapping(tk); kvh=grp%NKV; b=grp//NKV; nq=nkt-j
            pend=[None]*4
            for it in range(G*nq):
                h=kvh*G+(it%G if LOCK else it//nq); i=(nkt-1-it//G) if LOCK else j+it%nq
                yield 'bar'                      # sync A (all warps of the block)
                for w in range(4):               # releases of the previous tile (mid-tile)
                    if pend[w]: cnt[pend[w][0]]=pend[w][1]; pend[w]=None
                yield 'bar'                      # sync B
                turn = i-j if CHAIN==1 else j
                first = (i==j) if CHAIN==1 else (j==0); last = (j==0) if CHAIN==1 else (j==i)
                for w in range(4):
                    key=(b,h,i,w)
                    while not first and cnt.get(key,0)!=turn: yield 'wait'
                    order.setdefault(key,[]).append(j)
                    if last: cnt[key]=0
                    else: pend[w]=(key,turn+1)
            for w in range(4):
                if pend[w]: cnt[pend[w][0]]=pend[w][1]
        waiting=list(range(nblk)); res=[]; steps=0
        while waiting or res:
            while len(res)<R and waiting: waiting.pop(); res.append(block())
            g=rnd.choice(res); steps+=1
            if steps>10**7: return 'DEADLOCK'
            try: next(g)
            except StopIteration: res.remove(g)
        for (b,h,i,w),js in order.items():
            want=list(range(i,-1,-1)) if CHAIN==1 else list(range(0,i+1))
            if js!=want: return f'ORDER {js} != {want}'
        if any(v!=0 for v in cnt.values()): return 'COUNTERS'
        return 'ok'
    res=[]
    for (B,NKV,G,nkt) in [(2,4,2,4),(1,2,4,8),(1,4,1,6),(3,7,2,5),(20,1,2,3),(40,1,2,3)]:
        for CHAIN,TICK,LOCK in [(1,0,False),(2,1,True),(2,16,True),(2,32,True),(2,16,False)]:
            for R in (1,2,5,40):
                res.append(run(B,NKV,G,nkt,CHAIN,TICK,LOCK,R,R*7+nkt))
    print(len(res), 'runs:', {r:res.count(r) for r in set(res)})

if __name__ == '__main__':
    if '--protocol' in sys.argv:
        protocol()
    else:
        for E in (1, 2, 4):
            for o, d, v in [('jdesc', 'desc', 'kmaj'), ('jasc', 'asc', 'kmaj'), ('jasc', 'asc', 'lock'),
                            ('basc:16', 'asc', 'lock'), ('basc:32', 'asc', 'lock'), ('basc:8', 'asc', 'lock'),
                            ('jasc', 'none', 'lock')]:
                run(o, d, v, E)
