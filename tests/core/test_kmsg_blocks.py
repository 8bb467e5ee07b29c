"""The kernel-log check reads a saved log in blocks (issue 41.2): a run of dmesg Xid lines is
decoded by one findall and folded in bulk, every other line as before. These tests hold the
block reader to the line reader: the same findings, facts and counts on every kernel-log text
of the real-world corpus, on mixtures of real lines with the odd forms a log takes (blank and
cut lines, undecodable bytes, times out of order, multi-line reports), at any block size; and
a storm is read to its last line under a deadline counted in clock reads, not seconds."""
import json
import random

import pytest

from node_probe.checks import kmsg
from node_probe.host import kernel_log, xid
from tests.realworld import corpus

KMSG = corpus.artifacts({"kmsg"})
KMSG_BY_KEY = {a.key: a for a in KMSG}

# real lines (https://github.com/NVIDIA/nccl/issues/1439 , the corpus's Xid 13/109/48/31/43
# quotes, tests/realworld/corpus_kmsg_xid.py), in the dmesg form with its time
XID_MESSAGES = [
    b"NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
    b"Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    b"NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
    b"errorString CTX SWITCH TIMEOUT, Info 0x58005",
    b"NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
    b"double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
    b"0x7fdd60000 partition",
    b"NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr "
    b"00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault "
    b"is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
    b"NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008",
    b"NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
    b"the bus.",
    b"NVRM: Xid (PCI:0000:3b:00): 45, pid=2231, name=python, Ch 00000010, "
    b"caused by previous Xid 79",
    # two more GPUs off the bus (https://github.com/akash-network/support/issues/209 ,
    # https://github.com/wilicc/gpu-burn/issues/1): the Xid 79 counts gpu_lost takes, per GPU
    # in the order the log has them
    b"NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
    b"the bus.",
    b"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
]
# forms the block reader must leave to the line reader, or read exactly as it does
ODD = [b"\xff\xfe\xc3", b"\x1b[2J", b"\xe2\x82", b"\xc2\x85", b"\r", b" \t", b"\x00"]


def _state(path, fast: bool, max_groups: int = xid.MAX_GROUPS):
    stats = kmsg.Stats()
    log = kmsg.SavedLog(path, stats)
    grouper, summary = xid.Grouper(max_groups), kmsg.Summary()
    found = list(kmsg.analyze(log if fast else iter(log), 3000.0, 1.7e9, grouper, summary,
                              None, None, stats))
    return (json.dumps([(f.id, f.severity.value, f.subject, f.title, dict(f.evidence))
                        for f in found], default=str, sort_keys=True),
            json.dumps(summary.as_fact("log"), default=str, sort_keys=True),
            list(summary.as_fact("log")["lost"]),       # in log order: gpu_lost's order
            grouper.events, grouper.dropped, stats.records, stats.bytes)


def _same(tmp_path, data: bytes, max_groups: int = xid.MAX_GROUPS) -> list:
    p = tmp_path / "kern.log"
    p.write_bytes(data)
    fast, slow = _state(p, True, max_groups), _state(p, False, max_groups)
    assert fast == slow
    return json.loads(fast[0])


@pytest.mark.parametrize("a", KMSG, ids=[a.key for a in KMSG])
def test_blocks_read_every_corpus_log_as_lines_do(a, tmp_path):
    _same(tmp_path, (a.quote + "\n").encode())


def _line(rnd: random.Random, t: int, pool: list) -> bytes:
    k = rnd.random()
    if k < 0.6:
        msg = rnd.choice(XID_MESSAGES)
        if rnd.random() < 0.2:
            msg = msg.replace(b"PCI:", b"", 1) if rnd.random() < 0.5 else msg + rnd.choice(ODD)
        if rnd.random() < 0.1:
            msg = msg.replace(b"(PCI:0000:", b"(PCI: 0000:", 1).replace(b"): 4", b"):  04", 1)
        stamp = b"[%s%d.%06d]" % (b" " * rnd.randrange(6), t, rnd.randrange(10 ** 6))
        return rnd.choice([stamp + b" ", stamp, stamp + b"   ", b"", b"4,9,%d,-;" % t,
                           b"Feb 17 08:02:06 host kernel: "]) + msg
    if k < 0.8:
        line = rnd.choice(pool)
        return b"[%d.000000] %s" % (t, line) if rnd.random() < 0.5 else line
    if k < 0.85:    # blank as str.strip() has it: ASCII blanks, and the UTF-8 of other ones
        return rnd.choice([b"", b"   ", b"\t", b"\x1c \x1f", b"\xc2\x85", b"\xe2\x80\xa8\xc2\xa0",
                           b"\xe3\x80\x80", b"\xc2"])
    if k < 0.88:       # longer than MAX_LINE: read in part
        return b"[%d.1] " % t + rnd.choice(XID_MESSAGES) + b"B" * rnd.randrange(4000, 9000)
    return b"[%d.%06d] e1000e: eth0 NIC Link is Up 1000 Mbps Full Duplex" % (t, t)


@pytest.mark.parametrize("block", [64, 5000, kmsg.BLOCK_BYTES])
def test_blocks_read_mixed_logs_as_lines_do(block, tmp_path, monkeypatch):
    """Real lines of every kind the corpus has, Xid runs among them, in every form; some logs
    with times out of order (a concatenation), at block sizes that cut lines and runs."""
    monkeypatch.setattr(kernel_log, "BLOCK_BYTES", block)
    pool = [line.encode() for a in KMSG for line in a.quote.splitlines()]
    for seed in range(40):
        rnd = random.Random(seed)
        t, lines = 100, []
        for _ in range(rnd.randrange(1, 300)):
            t = max(0, t + (rnd.choice([0, 1, 2, -5]) if seed % 4 == 0 else rnd.randrange(3)))
            lines.append(_line(rnd, t, pool))
        _same(tmp_path, b"\n".join(lines) + (b"\n" if seed % 5 else b""))


@pytest.mark.parametrize("block", [64, 5000, kmsg.BLOCK_BYTES])
def test_blocks_fold_a_storm_past_its_bounds_as_lines_do(block, tmp_path, monkeypatch):
    """The bulk fold's other branches: more GPU/code pairs than the grouper keeps (the rest
    only counted, as in the audit's flood), more raw keys than it remembers (its cache
    emptied mid-log), one pair written several ways (`PCI:` dropped, blanks, a leading zero),
    bytes that do not decode in the bus id and the message, pids past MAX_PIDS, Xid 79 on
    several GPUs in one run."""
    monkeypatch.setattr(kernel_log, "BLOCK_BYTES", block)
    monkeypatch.setattr(xid, "MAX_RAW_KEYS", 12)
    for seed in range(12):
        rnd = random.Random(1000 + seed)
        lines = []
        for i in range(rnd.randrange(50, 1500)):
            msg = rnd.choice(XID_MESSAGES)
            if rnd.random() < 0.5:      # another GPU, written as the audit's flood writes it
                bus = b"0000:%02x:00" % rnd.randrange(40)
                msg = msg.replace(msg[msg.index(b"(PCI:") + 5:msg.index(b")")],
                                  bus + (rnd.choice(ODD) if rnd.random() < 0.2 else b""), 1)
            if rnd.random() < 0.3:
                msg = msg.replace(b"pid=", b"pid=%d" % rnd.randrange(30), 1)
            if rnd.random() < 0.1:
                msg = msg.replace(b"(PCI:", b"(", 1)
            if rnd.random() < 0.1:
                msg = msg.replace(b"): ", b"):  0", 1)
            lines.append(b"[%d.%06d] %s" % (100 + i // 7, i, msg))
        _same(tmp_path, b"\n".join(lines) + b"\n", max_groups=rnd.choice([3, 8, 40]))


def test_a_storm_is_read_to_its_last_line(tmp_path, monkeypatch):
    """100,000 Xid 13 lines, then one Xid 79 on another GPU: the check's clock is read a fixed
    number of times before its deadline (a stub that ticks once a read), and the block reader
    reaches the last line, where the line reader (a clock read every 4,096 lines) stopped."""
    storm = b"".join(b"[%d.%06d] %s\n" % (1000 + i // 1000, i % 1000, XID_MESSAGES[0].replace(
        b"name=<unknown>", b"name=w%d" % (i % 50))) for i in range(100_000))
    last = b"[2000.000000] " + XID_MESSAGES[5] + b"\n"
    p = tmp_path / "storm.log"
    p.write_bytes(storm + last)
    ticks = iter(range(10 ** 9))
    monkeypatch.setattr(kmsg.time, "monotonic", lambda: float(next(ticks)))
    stats = kmsg.Stats()
    found = list(kmsg.analyze(kmsg.iter_log_file(p, stats), stop_at=20.0, stats=stats))
    assert stats.cut is None and stats.records == 100_001
    by_code = {f.evidence["xid"]: f for f in found if f.id == "gpu.xid"}
    assert by_code[79].severity.value == "critical" and by_code[79].evidence["count"] == 1
    assert by_code[13].evidence["count"] == 100_000


def _live_state(path, fast: bool):
    stats = kmsg.Stats()
    log = kernel_log.KmsgLog(path, stats)
    grouper, summary = xid.Grouper(), kmsg.Summary()
    found = list(kmsg.analyze(log if fast else iter(log), 3000.0, 1.7e9, grouper, summary,
                              None, None, stats))
    return (json.dumps([(f.id, f.severity.value, f.subject, f.title, dict(f.evidence))
                        for f in found], default=str, sort_keys=True),
            json.dumps(summary.as_fact("log"), default=str, sort_keys=True),
            list(summary.as_fact("log")["lost"]), grouper.events, grouper.dropped,
            stats.records, stats.bytes, stats.cut)


def _records(lines: list, rnd: random.Random) -> bytes:
    """Lines as /dev/kmsg gives them: `prio,seq,usec,flags;message`, some with the dictionary
    lines that follow a record and a message's newline written `\\x0a`."""
    out = []
    for i, line in enumerate(lines):
        if rnd.random() < 0.05:
            line = line.replace(b" ", b"\\x0a", 1)
        out.append(b"%d,%d,%d,-;%s\n" % (rnd.choice([3, 4, 6]), i, 1000 * i + 7, line))
        if rnd.random() < 0.1:
            out.append(b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n")
    return b"".join(out)


@pytest.mark.parametrize("seed", range(len(KMSG) + 12))
def test_live_records_without_a_marker_are_only_counted(seed, tmp_path):
    """/dev/kmsg's records: those with no NVIDIA or kernel-hang marker, outside a multi-line
    report, are counted and never decoded (KmsgLog.items), with the same findings, fact and
    counts as reading every record (each corpus kernel log, then real lines mixed)."""
    rnd = random.Random(seed)
    if seed < len(KMSG):        # each corpus log as a ring buffer of its own
        lines = [line.encode() for line in KMSG[seed].quote.splitlines()]
    else:
        pool = [line.encode() for a in KMSG for line in a.quote.splitlines()]
        lines = [_line(rnd, 100 + i, pool) for i in range(rnd.randrange(50, 600))]
    p = tmp_path / "kmsg"
    p.write_bytes(_records(lines, rnd))
    assert _live_state(p, True) == _live_state(p, False)


def test_live_records_of_a_report_are_read_while_it_lasts(tmp_path):
    """The lines of a multi-line report carry no marker of their own: while one is being read
    (an AER report's `device [8086:6f04] error status/mask` line; a hung task's stack, whose
    64-frame bound decides whether a later [nvidia_uvm] frame is its), every record is read;
    and a marker a message has only once its `\\x0a` is a blank (`PCIe\\x0aBus Error`)."""
    from tests.core.test_kmsg_forms import GPU_BURN_1
    hung = [line.encode()
            for line in KMSG_BY_KEY["returnn#1480-dmesg-H-uvm-hang"].quote.splitlines()]
    lines = ([line.encode().replace(b"PCIe Bus Error", b"PCIe\\x0aBus Error").replace(
                b"0000:00:02.0", b"0000:00:03.0") for line in GPU_BURN_1.splitlines()[5:8]]
             + [line.encode() for line in GPU_BURN_1.splitlines()]
             + hung[:4] + [hung[3]] * 70 + hung[9:])
    p = tmp_path / "kmsg"
    p.write_bytes(b"".join(b"4,%d,%d,-;%s\n" % (i, 1000 * i, line) for i, line in enumerate(lines)))
    fast = _live_state(p, True)
    assert fast == _live_state(p, False)
    found = json.loads(fast[0])
    assert {f[0] for f in found} >= {"gpu.pcie_aer", "kernel.hung_task"}
    assert "0000:00:03.0" in fast[0]


def test_long_lines_are_cut_as_a_split_cuts_them():
    """_cut_long looks at a block every MAX_LINE // 2 bytes instead of splitting it into lines:
    every line, at every length around the bounds, is cut exactly as cutting each line is."""
    m = kernel_log.MAX_LINE
    rnd = random.Random(7)
    for _ in range(2000):
        lens = [rnd.choice([0, 1, 90, m // 2 - 1, m // 2, m // 2 + 1, m - 1, m, m + 1, 2 * m - 1,
                            2 * m, 2 * m + 1, rnd.randrange(3 * m)])
                for _ in range(rnd.randrange(1, 8))]
        whole = b"".join(b"x" * n + b"\n" for n in lens)
        assert kernel_log._cut_long(whole) == b"\n".join(
            [p[:m] for p in whole.split(b"\n")]), lens


def test_times_are_in_order_as_their_numbers_are():
    """xid.in_order compares a run's times as bytes when they share one shape (length, dot),
    as numbers otherwise: the same answer as comparing every time as a float, for times of one
    shape, of mixed shapes (`10.000000`, `2.000000`, `9.5`), with leading zeros, going back."""
    rnd = random.Random(11)
    for _ in range(3000):
        ints = rnd.choice([1, 2, 3, 6])
        fracs = rnd.choice([1, 6, 9])
        times = []
        for _ in range(rnd.randrange(1, 12)):
            i, f = ints, fracs
            if rnd.random() < 0.2:          # another shape
                i, f = rnd.randrange(1, 8), rnd.randrange(1, 10)
            times.append(b"%0*d.%0*d" % (i, rnd.randrange(10 ** i), f, rnd.randrange(10 ** f)))
        if rnd.random() < 0.5:
            times.sort(key=float)
        floats = [float(t) for t in times]
        assert xid.in_order(times) == (floats == sorted(floats)), times
