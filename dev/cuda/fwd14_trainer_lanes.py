# Lane-by-lane emulation (float64, on the host) of train_mhar.cu's route_forward14_kernel value layout:
# Fwd14Lanes, fwd14_reduce, fwd14_bcast1, the lse writers and the PART head index, on the trainer's
# route_geometry, for every bf16 VEC = 8 layout with NCH <= 4 reached by some (C, H), KX = 0..3.
# Run: python3 dev/cuda/fwd14_trainer_lanes.py (NOTES_route.md, "v14 in the trainer").
import random
def lg(x): return 0 if x <= 1 else 1 + lg(x // 2)
def p2(x): return 1 if x <= 1 else 2 * p2((x + 1) // 2)
def geometry(C, H):   # route_geometry, VEC = 8 only (None: not a VEC = 8 layout)
    HC = C // H
    if C % H or HC % 8: return None
    nch = 1
    while nch * 256 < C: nch *= 2
    if nch > 8: return None
    if H == 1: seg, cph = 32, nch
    elif 256 % HC == 0: seg, cph = HC // 8, 1
    elif HC % 256 == 0: seg, cph = 32, HC // 256
    else: return None
    return nch, seg, cph
def check(C, H, KX, rnd):
    NCH, SEG, cph = geometry(C, H)
    HC = C // H
    V = (KX + 1) * NCH; P = p2(V); LP = lg(P); R = lg(SEG); T = min(R, LP); SL = P >> T
    value_of = lambda m, lane: m + (((lane & (SEG - 1)) >> (R - T)) << (LP - T))
    # lane partials: value x*NCH+ch = qg_x . v over the lane's 8 channels of chunk ch (zero past C)
    y = [[0.0] * P for _ in range(32)]
    for lane in range(32):
        for x in range(KX + 1):
            for ch in range(NCH):
                y[lane][x * NCH + ch] = rnd.uniform(-1, 1) if ch * 256 + lane * 8 < C else 0.0
    if SEG == 32 and NCH > 1 and cph > 1:   # pre-sum over the head's chunks
        for lane in range(32):
            for x in range(KX + 1):
                z = [sum(y[lane][x * NCH + c2] for c2 in range(NCH) if c2 // cph == ch // cph) for ch in range(NCH)]
                for ch in range(NCH): y[lane][x * NCH + ch] = z[ch]
    # reference: the head sum of value (x, ch) for a lane's segment
    def ref(lane, k):
        s0 = lane & ~(SEG - 1)
        return sum(y[l][k] for l in range(s0, s0 + SEG))
    refs = [[ref(lane, k) for k in range(P)] for lane in range(32)]
    # fwd14_reduce
    for r in range(T):
        half = P >> (r + 1); o = SEG >> (r + 1)
        new = [row[:] for row in y]
        for lane in range(32):
            hi = (lane & o) != 0
            for m in range(half):
                send_partner = y[lane ^ o][m] if ((lane ^ o) & o) else y[lane ^ o][m + half]
                keep = y[lane][m + half] if hi else y[lane][m]
                new[lane][m] = keep + send_partner
        y = new
    o = SEG >> (T + 1)
    while o > 0:
        y = [[y[lane][m] + y[lane ^ o][m] if m < SL else 0 for m in range(P)] for lane in range(32)]
        o >>= 1
    err = 0.0
    for lane in range(32):
        for m in range(SL):
            k = value_of(m, lane)
            err = max(err, abs(y[lane][m] - refs[lane][k]))
    # fwd14_bcast1: value k of the segment from lane ((k / SL) << (R - T)) relative, slot k % SL
    for lane in range(32):
        s0 = lane & ~(SEG - 1)
        for k in range(V):
            srcl = s0 + (((k // SL) << (R - T)) if T > 0 else (lane - s0))
            assert value_of(k % SL, srcl) == k, (C, H, KX, lane, k)
            err = max(err, abs(y[srcl][k % SL] - refs[lane][k]))
    # lse writers: one per (site, head with channels < C), head = c / HC = the chunk's head
    writes = {}
    for lane in range(32):
        for m in range(SL):
            k = value_of(m, lane); x, ch = k // NCH, k % NCH
            c = ch * 256 + (lane & ~(SEG - 1)) * 8
            if k < V and (lane & ((1 << (R - T)) - 1)) == 0 and c < C and ch % cph == 0:
                writes.setdefault((x, c // HC), []).append(lane)
                # the head really is the one of the chunk's channels in this segment
                assert all((ch * 256 + l * 8) // HC == c // HC for l in range(lane & ~(SEG - 1), (lane & ~(SEG - 1)) + SEG) if ch * 256 + l * 8 < C)
    want = {(x, h) for x in range(KX + 1) for h in range(H)}
    assert set(writes) == want and all(len(v) == 1 for v in writes.values()), (C, H, KX, writes)
    return err
rnd = random.Random(1)
worst = 0.0; n = 0; layouts = set()
for C in range(8, 1025, 8):
    for H in range(1, C // 8 + 1):
        g = geometry(C, H)
        if g is None or g[0] > 4: continue
        for KX in range(4):
            worst = max(worst, check(C, H, KX, rnd)); n += 1
        layouts.add(g[:2])
print("v14 trainer lanes: %d (C, H, KX) cases, layouts <8,NCH,SEG>: %s, max |sum err| %.1e: ok" % (n, sorted(layouts), worst))
