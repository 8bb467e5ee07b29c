"""The offline readers on real captures (tests/offline/sources.py says where each comes from
and what it showed), and the slow judges over what they read.

Idle GPUs at Gen1 (A10 text, A10G, RTX 3090, the pasted A4000 and 4090 LnkSta lines) and a busy
healthy GPU (RTX 3080 at 65 %, Gen4 x16) are the controls: they must raise nothing.
"""
from __future__ import annotations

import gzip

import pynvml
import pytest

from node_probe.checks.slow import judge
from node_probe.host.offline import UnknownFormat, bounded, lspci, nvlink, nvsmi_text, \
    nvsmi_xml, values
from tests.offline.sources import DATA, SOURCES


def lines(name):
    return bounded.iter_lines(DATA / name)


def xml_gpus(name):
    return nvsmi_xml.parse(lines(name))


def ids(findings):
    return sorted(f.id for f in findings)


def test_every_data_file_has_its_source():
    assert {p.name for p in DATA.iterdir()} == set(SOURCES)


# -- the contract's bits are NVML's ---------------------------------------------------------

def test_reason_bits_are_nvmls_own():
    """nvml.h nvmlClocksEventReason* as nvidia-ml-py (the field's bindings) defines them."""
    want = {"gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
            "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
            "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
            "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
            "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
            "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
            "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
            "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
            "display_clocks_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting}
    assert nvsmi_xml.REASON_TAGS == want
    assert sorted(nvsmi_text.REASON_LINES.values()) == sorted(want.values())
    assert pynvml.nvmlClocksThrottleReasonHwSlowdown == pynvml.nvmlClocksEventReasonHwSlowdown


# -- nvidia-smi -q -x ----------------------------------------------------------------------

def test_a10g_xml_idle_gen1_x8():
    [g] = xml_gpus("nvsmi-x-a10g.xml")
    assert g["uuid"] == "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"
    assert g["pci_bus_id"] == "00000000:00:1E.0" and g["name"] == "NVIDIA A10G"
    assert g["pcie"] == {"gen_cur": 1, "gen_max": 4, "gen_gpu_max": None, "gen_host_max": None,
                         "width_cur": 8, "width_max": 16, "width_gpu_max": None}
    assert g["utilization_gpu_pct"] == 0 and g["processes"] == []
    assert g["clocks"] == {"event_reasons": 0x1, "sm_mhz": 210, "sm_max_mhz": 1710,
                           "mem_mhz": 405, "mem_max_mhz": 6251}
    assert g["temperature"] == {"gpu_c": 17.0, "slowdown_c": 95.0, "shutdown_c": 98.0}
    assert g["power"] == {"draw_w": 25.58, "limit_w": 300.0, "default_limit_w": 300.0}
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False,
                                  "failure": False,
                                  "histogram": {"max": 192, "high": 0, "partial": 0, "low": 0,
                                                "none": 0}}


def test_a10g_idle_gen1_is_not_judged_but_its_x8_width_is():
    """The generation is judged only under load (idle GPUs drop to Gen1 by design); the width
    is judged at any time: x8 of a reported x16 max is said, as the live probe would say it
    from NVML's same numbers (the capture is an AWS VM: see the report on platforms whose VM
    reports a x16 max on a x8 link)."""
    found = judge.judge_gpus(xml_gpus("nvsmi-x-a10g.xml"))
    assert ids(found) == ["gpu.pcie_downtrained"]
    assert "x8 of Gen4 x16" in found[0].title and "Gen1" not in found[0].title


def test_busy_healthy_rtx3080_raises_nothing():
    [g] = xml_gpus("nvsmi-x-rtx-3080-v13.xml")
    assert g["utilization_gpu_pct"] == 65
    assert (g["pcie"]["gen_cur"], g["pcie"]["gen_max"], g["pcie"]["width_cur"]) == (4, 4, 16)
    assert g["clocks"]["event_reasons"] == 0     # v13 <clocks_event_reasons>, none active
    assert g["ecc"] is None and g["remapped_rows"] is None   # GeForce: N/A, not zero
    assert judge.judge_gpus([g]) == []


def test_idle_rtx3090_with_a_lowered_power_limit_raises_nothing():
    [g] = xml_gpus("nvsmi-x-rtx-3090-v12.xml")
    assert g["power"]["limit_w"] == 200.0 and g["power"]["default_limit_w"] == 350.0
    assert g["clocks"]["event_reasons"] == 0x1 and g["pcie"]["gen_cur"] == 1
    assert judge.judge_gpus([g]) == []


def test_a100_mig_utilisation_not_known_stays_none():
    [g] = xml_gpus("nvsmi-x-a100-sxm4-v12.xml")
    assert g["utilization_gpu_pct"] is None        # N/A under MIG: never 0
    assert g["ecc"] == {"sbe_volatile": 0, "dbe_volatile": 0, "retired_pending": None}
    assert judge.judge_gpus([g]) == []


def test_t4_processes_are_the_compute_ones():
    [g] = xml_gpus("nvsmi-x-tesla-t4.xml")
    assert g["processes"] == [{"pid": 5762, "used_memory_bytes": 1005 << 20}]
    assert g["ecc"]["retired_pending"] is False


# -- nvidia-smi -q text --------------------------------------------------------------------

def test_a10_text_idle_record():
    [g] = nvsmi_text.parse(lines("nvsmi-q-a10-idle.txt"))
    assert g == {
        "index": 0, "uuid": "GPU-51ae0086-e1ac-4a20-f062-9caa44e4df6d",
        "pci_bus_id": "00000000:06:00.0", "name": "NVIDIA A10",
        "pcie": {"gen_cur": 1, "gen_max": 4, "gen_gpu_max": 4, "gen_host_max": None,
                 "width_cur": 16, "width_max": 16, "width_gpu_max": None},
        "utilization_gpu_pct": 0,
        "clocks": {"event_reasons": 0x1, "sm_mhz": 210, "sm_max_mhz": 1695, "mem_mhz": 405,
                   "mem_max_mhz": 6251},
        "temperature": {"gpu_c": 33.0, "slowdown_c": 98.0, "shutdown_c": 101.0},
        "power": {"draw_w": 21.3, "limit_w": 150.0, "default_limit_w": 150.0},
        "ecc": {"sbe_volatile": 0, "dbe_volatile": 0, "retired_pending": None},
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False,
                          "failure": False, "histogram": {"max": 192, "high": 0, "partial": 0,
                                                          "low": 0, "none": 0}},
        "processes": []}
    assert judge.judge_gpus([g]) == []          # idle at Gen1: the healthy control


# https://github.com/ollama/ollama/issues/6163 : `nvidia-smi -q -d POWER,TEMPERATURE,PERFORMANCE`
# "while test is running" (the thread: utilisation never above 70 %); quoted up to the post's
# own cut. SW Power Cap Active at 77 C.
OLLAMA_6163 = """==============NVSMI LOG==============

Timestamp                                 : Mon Aug  5 12:57:09 2024
Driver Version                            : 545.29.06
CUDA Version                              : 12.3

Attached GPUs                             : 1
GPU 00000000:0B:00.0
    Performance State                     : P2
    Clocks Event Reasons
        Idle                              : Not Active
        Applications Clocks Setting       : Not Active
        SW Power Cap                      : Active
        HW Slowdown                       : Not Active
            HW Thermal Slowdown           : Not Active
            HW Power Brake Slowdown       : Not Active
        Sync Boost                        : Not Active
        SW Thermal Slowdown               : Not Active
        Display Clock Setting             : Not Active
    Temperature
        GPU Current Temp                  : 77 C
        GPU T.Limit Temp                  : N/A
        GPU Shutdown Temp                 : 100 C
        GPU Slowdown Temp                 : 97 C
        GPU Max Operating Temp            : 88 C
        GPU Target Temperature            : 83 C
        Memory Current Temp               : N/A
"""

# https://github.com/kubeflow/kubeflow/issues/68 : `nvidia-smi -q | grep -A8 'Clocks Throttle'`
# on an idle GPU (the older section name; HW Thermal/Power Brake nested under HW Slowdown)
KUBEFLOW_68 = """GPU 00000000:00:04.0
    Clocks Throttle Reasons
        Idle                        : Active
        Applications Clocks Setting : Not Active
        SW Power Cap                : Not Active
        HW Slowdown                 : Not Active
            HW Thermal Slowdown     : Not Active
            HW Power Brake Slowdown : Not Active
        Sync Boost                  : Not Active
        SW Thermal Slowdown         : Not Active
"""


def test_partial_query_reads_what_it_has_and_nothing_more():
    [g] = nvsmi_text.parse(OLLAMA_6163.splitlines())
    assert g["clocks"]["event_reasons"] == 0x4
    assert g["temperature"] == {"gpu_c": 77.0, "slowdown_c": 97.0, "shutdown_c": 100.0}
    assert g["utilization_gpu_pct"] is None and g["processes"] is None
    assert g["uuid"] is None and g["pci_bus_id"] == "00000000:0B:00.0"
    assert g["power"] == {"draw_w": None, "limit_w": None, "default_limit_w": None}
    # busy or not is not in the paste: the clock judge does not guess
    assert judge.judge_gpus([g]) == []
    busy = dict(g, utilization_gpu_pct=100, clocks=dict(g["clocks"], sm_mhz=1500,
                                                        sm_max_mhz=2100))
    # SW power cap alone is the GPU at its power limit, which heavy work reaches by design:
    # said only when the limit is known to be lowered below the default (not in this paste)
    assert judge.judge_gpus([busy]) == []
    capped = dict(busy, power={"draw_w": 199.0, "limit_w": 200.0, "default_limit_w": 350.0})
    assert ids(judge.judge_gpus([capped])) == ["gpu.clocks_throttled"]


def test_old_throttle_section_name_and_nested_lines():
    # the grep cut the bus id line: the quoted block under the GPU line it was cut from
    [g] = nvsmi_text.parse(KUBEFLOW_68.splitlines())
    assert g["clocks"]["event_reasons"] == 0x1


def test_text_that_is_not_nvidia_smi_is_refused():
    with pytest.raises(UnknownFormat):
        nvsmi_text.parse(["hello", "world"])


# -- lspci -vvv -----------------------------------------------------------------------------

def test_h100_hgx_lspci_gpus_at_gen5_x16_and_the_downgraded_ports():
    recs = lspci.parse(lines("lspci-vvv-h100-hgx.txt.gz"))
    gpus = {k: r for k, r in recs.items() if lspci.is_nvidia_gpu(r)}
    assert sorted(gpus) == ["0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0",
                            "0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0"]
    for r in gpus.values():
        assert (r["speed_cur_gts"], r["width_cur"], r["speed_max_gts"], r["width_max"]) == \
            (32.0, 16, 32.0, 16)
        assert r["downgraded"] is False and r["driver"] == "nvidia"
    assert gpus["0000:19:00.0"]["aer"]["correctable"] == ["RxErr", "BadTLP", "Timeout"]
    # the path up, from the bridges' `Bus: primary=.., secondary=..` lines: switch downstream
    # port, switch upstream port, root port, all Gen5 x16
    chain, cur = [], "0000:19:00.0"
    while recs[cur]["upstream"]:
        cur = recs[cur]["upstream"]
        chain.append(cur)
    assert chain == ["0000:17:01.0", "0000:16:00.0", "0000:15:01.0"]
    sw = recs["0000:17:03.0"]     # a PEX890xx port at 16GT/s (downgraded) of 32GT/s
    assert (sw["speed_cur_gts"], sw["speed_max_gts"], sw["downgraded"]) == (16.0, 32.0, True)
    assert recs["0000:01:00.0"]["width_cur"] == 1 and recs["0000:01:00.0"]["width_max"] == 2
    gpu_recs = [{"index": i, "uuid": None, "pci_bus_id": k} for i, k in enumerate(gpus)]
    assert judge.judge_gpus(gpu_recs, recs) == []


# Lines quoted from threads (each a GPU function's block as posted):
# https://github.com/geerlingguy/raspberry-pi-pcie-devices/issues/692 (RTX A4000 on a Pi: idle
# at 2.5GT/s, the post's own indentation)
A4000_692 = ["    LnkCap: Port #0, Speed 16GT/s, Width x16, ASPM L0s L1, Exit Latency L0s <512ns, "
             "L1 <4us",
             "    LnkSta: Speed 2.5GT/s (downgraded), Width x16"]
# https://github.com/geerlingguy/raspberry-pi-pcie-devices/issues/480 (Quadro RTX 8000 in the
# Pi's Gen2 x1 slot: the link trains at the slot's 5GT/s x1)
RTX8000_480 = ["\t\tLnkSta:\tSpeed 5GT/s (downgraded), Width x1 (downgraded)",
               "\t\t\tTrErr- Train- SlotClk+ DLActive- BWMgmt- ABWMgmt-",
               "\t\tUESta:\tDLP- SDES- TLP- FCP- CmpltTO- CmpltAbrt- UnxCmplt- RxOF- MalfTLP- "
               "ECRC- UnsupReq- ACSViol-",
               "\t\tCESta:\tRxErr- BadTLP- BadDLLP- Rollover- Timeout- AdvNonFatalErr+"]
# https://github.com/janhq/jan/issues/183 (RTX 4090 on a riser; the thread pointed to power
# saving: an idle GPU at Gen1)
RTX4090_JAN183 = ["    LnkCap: Port #0, Speed 16GT/s, Width x16, ASPM L1, Exit Latency L1 <16us",
                  "    LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok)"]


def test_pasted_lnksta_lines():
    a = lspci._record("0000:01:00.0", "VGA compatible controller: NVIDIA", A4000_692)
    assert (a["speed_cur_gts"], a["width_cur"], a["speed_max_gts"], a["width_max"]) == \
        (2.5, 16, 16.0, 16) and a["downgraded"] is True
    q = lspci._record("0000:01:00.0", "VGA compatible controller: NVIDIA", RTX8000_480)
    assert (q["speed_cur_gts"], q["width_cur"], q["downgraded"]) == (5.0, 1, True)
    assert q["aer"] == {"uncorrectable": [], "correctable": ["AdvNonFatalErr"]}
    j = lspci._record("0000:01:00.0", "VGA compatible controller: NVIDIA", RTX4090_JAN183)
    assert (j["speed_cur_gts"], j["width_cur"], j["downgraded"]) == (2.5, 16, True)


def test_idle_gen1_lspci_alone_raises_nothing():
    """lspci says nothing of load: the generation is not judged, the full width is fine."""
    for body in (A4000_692, RTX4090_JAN183):
        rec = lspci._record("0000:01:00.0", "VGA compatible controller: NVIDIA", body)
        g = {"index": None, "uuid": None, "pci_bus_id": "0000:01:00.0"}
        assert judge.judge_gpus([g], {"0000:01:00.0": rec}) == []


# -- bounds and hostile input ---------------------------------------------------------------

def test_gzip_bomb_stops_at_the_cap(tmp_path):
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (64 << 20), 9))     # 64 MiB of zeros in ~64 KB
    assert bomb.stat().st_size < (1 << 20)
    st = bounded.Stats()
    got = sum(len(x) for x in bounded.iter_lines(bomb, st, max_text=1 << 20))
    assert got <= 1 << 20 and st.text <= 1 << 20
    assert st.cut and "gzip cap" in st.cut


def test_gzip_members_are_all_read(tmp_path):
    """nvidia-bug-report.sh appends one gzip member per section (`| gzip -c >> log.gz`)."""
    f = tmp_path / "two.gz"
    f.write_bytes(gzip.compress(b"first\n") + gzip.compress(b"second\n"))
    assert list(bounded.iter_lines(f)) == ["first", "second"]


def test_damaged_gzip_reads_up_to_the_damage(tmp_path):
    text = b"".join(b"line %d %s\n" % (i, bytes([65 + i * 7 % 26]) * (i % 50))
                    for i in range(20000))
    packed = gzip.compress(text)
    f = tmp_path / "bad.gz"
    f.write_bytes(packed[:len(packed) // 2] + b"\xff" * 4096)
    st = bounded.Stats()
    got = list(bounded.iter_lines(f, st))          # never raises
    assert 0 < len(got) < 20000
    assert got[:-1] == text.decode().splitlines()[:len(got) - 1]
    assert st.cut and "damaged" in st.cut


def test_an_endless_line_is_cut(tmp_path):
    f = tmp_path / "long.txt"
    f.write_bytes(b"x" * (3 << 20) + b"\nnext\n")
    got = list(bounded.iter_lines(f))
    assert [len(x) for x in got] == [bounded.MAX_LINE, 4]


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
 <!ENTITY a "aaaaaaaaaa">
 <!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
 <!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
]>
<nvidia_smi_log><gpu id="x"><product_name>&c;</product_name></gpu></nvidia_smi_log>
"""
EXTERNAL = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><gpu id="x"><product_name>&x;</product_name></gpu></nvidia_smi_log>
"""


@pytest.mark.parametrize("doc", [BILLION_LAUGHS, EXTERNAL])
def test_xml_entities_are_refused_never_expanded(doc):
    with pytest.raises(nvsmi_xml.Refused):
        nvsmi_xml.parse(doc.splitlines())


def test_xml_depth_is_capped():
    deep = "<nvidia_smi_log>" + "<a>" * 100 + "</a>" * 100 + "</nvidia_smi_log>"
    with pytest.raises(UnknownFormat):
        nvsmi_xml.parse([deep])


def test_xml_of_another_kind_is_refused():
    with pytest.raises(UnknownFormat):
        nvsmi_xml.parse(['<?xml version="1.0"?>', "<html><body/></html>"])


@pytest.mark.parametrize("text,want", [("16x", 16), ("65 %", 65), ("N/A", None),
                                       ("300.00 W", 300), ("300.50 W", None), ("Unknown Error", None),
                                       ("9" * 40, None), ("512 bank(s)", 512)])
def test_integers(text, want):
    assert values.integer(text) == want


# -- nvidia-smi nvlink --status ---------------------------------------------------------------

# https://github.com/Azure/azhpc-diagnostics/issues/73 : a V100 with two NVLinks down (the
# issue asks for a check of exactly this; UUID elided in the post)
AZHPC_73 = """GPU 3: Tesla V100-SXM2-32GB (UUID: ...)
         Link 0: 25.781 GB/s
         Link 1: 25.781 GB/s
         Link 2: 25.781 GB/s
         Link 3: <inactive>
         Link 4: 25.781 GB/s
         Link 5: <inactive>
"""


def test_nvlink_status_links_and_inactive_ones():
    [g] = nvlink.parse(AZHPC_73.splitlines())
    assert g["index"] == 3 and g["uuid"] is None
    assert [(x["link"], x["active"]) for x in g["nvlink"]] == [
        (0, True), (1, True), (2, True), (3, False), (4, True), (5, False)]
    assert all(x["errors"] == {} for x in g["nvlink"])     # counters: not in this command
    peer = {"index": 2, "uuid": "GPU-peer", "pci_bus_id": "0000:02:00.0",
            "nvlink": [dict(x, active=True) for x in g["nvlink"]]}
    me = {"index": 3, "uuid": "GPU-me", "pci_bus_id": "0000:03:00.0"}
    nvlink.attach([me], [g])
    found = judge.judge_gpus([peer, me])
    assert ids(found) == ["gpu.nvlink_degraded"] and "4 of 6" in found[0].title


def test_a100_all_links_up_raise_nothing():
    status = nvlink.parse(lines("nvlink-status-a100.txt"))
    assert len(status) == 8 and all(len(s["nvlink"]) == 12 for s in status)
    assert all(x["active"] for s in status for x in s["nvlink"])
    gpus = [{"index": s["index"], "uuid": s["uuid"], "pci_bus_id": f"0000:{i:02x}:00.0",
             "nvlink": s["nvlink"]} for i, s in enumerate(status)]
    assert judge.judge_gpus(gpus) == []
    other = {"index": 0, "uuid": "GPU-51ae0086-e1ac-4a20-f062-9caa44e4df6d"}
    nvlink.attach([other], status)      # GPU 0 of the status is another UUID: not attached
    assert "nvlink" not in other


# -- a GPU held by a process but idle ---------------------------------------------------------

# Lines of https://github.com/influxdata/telegraf/blob/74bae14c4081c88c014e87840cbdf4167d9e31b1/plugins/inputs/nvidia_smi/testdata/pro-6000-maxq-blackwell-v13.xml
# (RTX PRO 6000 Blackwell Max-Q, driver 590.44.01), each quoted exactly, the elements between
# them left out: llama-server holds 65,710 MiB of the GPU, which is idle between requests
# (gpu_util 0 %, P8, SM at 180 of 3090 MHz) with its link at Gen1 of Gen4.
PRO6000_HELD_IDLE = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">
<nvidia_smi_log>
	<gpu id="00000000:61:00.0">
		<product_name>NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition</product_name>
		<uuid>GPU-12345678-aaaa-bbbb-cccc-0123456789ab</uuid>
		<pci>
			<pci_bus_id>00000000:61:00.0</pci_bus_id>
			<pci_gpu_link_info>
				<pcie_gen>
					<max_link_gen>4</max_link_gen>
					<current_link_gen>1</current_link_gen>
					<device_current_link_gen>1</device_current_link_gen>
					<max_device_link_gen>5</max_device_link_gen>
					<max_host_link_gen>4</max_host_link_gen>
				</pcie_gen>
				<link_widths>
					<max_link_width>16x</max_link_width>
					<current_link_width>16x</current_link_width>
				</link_widths>
			</pci_gpu_link_info>
		</pci>
		<performance_state>P8</performance_state>
		<utilization>
			<gpu_util>0 %</gpu_util>
			<memory_util>0 %</memory_util>
		</utilization>
		<clocks>
			<graphics_clock>180 MHz</graphics_clock>
			<sm_clock>180 MHz</sm_clock>
			<mem_clock>405 MHz</mem_clock>
			<video_clock>600 MHz</video_clock>
		</clocks>
		<max_clocks>
			<graphics_clock>3090 MHz</graphics_clock>
			<sm_clock>3090 MHz</sm_clock>
			<mem_clock>14001 MHz</mem_clock>
			<video_clock>3090 MHz</video_clock>
		</max_clocks>
		<processes>
			<process_info>
				<gpu_instance_id>N/A</gpu_instance_id>
				<compute_instance_id>N/A</compute_instance_id>
				<pid>116860</pid>
				<type>C</type>
				<process_name>/root/src/llama.cpp/build/bin/llama-server</process_name>
				<used_memory>65710 MiB</used_memory>
			</process_info>
		</processes>
	</gpu>

</nvidia_smi_log>
"""


def test_held_but_idle_gpu_reads_as_such():
    [g] = nvsmi_xml.parse(PRO6000_HELD_IDLE.splitlines())
    assert g["utilization_gpu_pct"] == 0
    assert g["processes"] == [{"pid": 116860, "used_memory_bytes": 65710 << 20}]
    assert (g["pcie"]["gen_cur"], g["pcie"]["gen_max"], g["pcie"]["gen_gpu_max"]) == (1, 4, 5)


def test_held_but_idle_gpu_at_gen1_raises_nothing():
    """Utilisation says idle: the held memory is not load (slow's judges since 7feec11; the
    offline report raised this case from this capture)."""
    assert judge.judge_gpus(nvsmi_xml.parse(PRO6000_HELD_IDLE.splitlines())) == []


def test_plain_bug_report_is_read_too(tmp_path):
    from node_probe.host.offline import bugreport
    f = tmp_path / "nvidia-bug-report.log"
    f.write_text("\n".join([
        "____________________________________________", "",
        "Start of NVIDIA bug report log file.  Please include this file, along", "",
        "____________________________________________", "",
        "/usr/bin/nvidia-smi --query", "", *lines("nvsmi-q-a10-idle.txt"), "",
        "____________________________________________", "",
        "/usr/bin/nvidia-smi --query --unit", "", "Unit 0", "    Product Name : x", ""]))
    rep = bugreport.read(f, tmp_path)
    assert [g["uuid"] for g in rep.gpus] == ["GPU-51ae0086-e1ac-4a20-f062-9caa44e4df6d"]
    assert rep.links is None and rep.kernel_log is None
    assert rep.sections == ("/usr/bin/nvidia-smi --query",)


def test_text_outline_depth_and_column_zero_lines_are_bounded():
    deep = ["GPU 00000000:06:00.0"] + [" " * (i + 1) + f"K{i} : {i}" for i in range(200)]
    [(bus, root)] = nvsmi_text.outline(deep)
    depth, node = 0, root
    while node.children:
        node, depth = node.children[0], depth + 1
    assert depth == nvsmi_text.MAX_DEPTH - 1
    # a line at column 0 ends the GPU block: what follows is not read into it
    [(_, g)] = nvsmi_text.outline(["GPU 0000:06:00.0", "    Product Name : A", "Unit 0",
                                   "    Product Name : B"])
    assert g.val("Product Name") == "A" and len(g.children) == 1


def test_lspci_hex_dump_lines_end_a_function_block():
    """`lspci -nnDvvvxxxx` (the bug report's) follows each function with column-0 hex rows."""
    text = ["0000:3b:00.0 3D controller [0302]: NVIDIA Corporation GH100 [10de:2330] (rev a1)",
            "\t\tLnkSta:\tSpeed 32GT/s (ok), Width x16 (ok)",
            "00: de 10 30 23 06 05 10 00 a1 00 02 03 00 00 00 00",
            "\t\tLnkSta:\tSpeed 2.5GT/s (downgraded), Width x1 (downgraded)",
            "0000:3c:00.0 Bridge [0680]: NVIDIA Corporation Device [10de:22a3] (rev a1)"]
    recs = lspci.parse(text)
    assert recs["0000:3b:00.0"]["speed_cur_gts"] == 32.0 and not recs["0000:3b:00.0"]["downgraded"]
    assert recs["0000:3c:00.0"]["speed_cur_gts"] is None



# https://github.com/noonghunna/club-3090/issues/1095 ("2x RTX 3090 PCIe x8"): the GPU
# function's LnkCap/LnkSta and those of its upstream bridge 0000:00:03.2, as posted (the GPU's
# bus number was redacted in the post: 0b here); the board gives each GPU an x8 slot.
RTX3090_X8_GPU = ["\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x16, ASPM L0s L1, Exit Latency "
                  "L0s <512ns, L1 <4us",
                  "\t\tLnkSta:\tSpeed 2.5GT/s (downgraded), Width x8 (downgraded)"]
RTX3090_X8_BRIDGE = ["\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x8, ASPM L1, Exit Latency L1 "
                     "<64us",
                     "\t\tLnkSta:\tSpeed 2.5GT/s, Width x8"]


def test_x8_slot_lspci_alone_says_x8_and_the_bridge_clears_it():
    """The GPU's lines alone compare the link with the GPU's own capability (x8 of x16: said);
    with the bridge above (in a whole `lspci -vvv`, the bridge whose `Bus: ... secondary=` is
    the GPU's bus; this post quoted both) the link's maximum is the slot's x8 and nothing is
    wrong with the width."""
    gpu = lspci._record("0000:0b:00.0", "VGA compatible controller: NVIDIA", RTX3090_X8_GPU)
    bridge = lspci._record("0000:00:03.2", "PCI bridge", RTX3090_X8_BRIDGE)
    assert (gpu["width_cur"], gpu["width_max"], gpu["downgraded"]) == (8, 16, True)
    # no (ok)/(downgraded) printed for the port: compared from LnkCap (2.5 of 16 GT/s, idle)
    assert (bridge["width_cur"], bridge["width_max"], bridge["downgraded"]) == (8, 8, True)
    g = {"index": None, "uuid": None, "pci_bus_id": "0000:0b:00.0"}
    alone = judge.judge_gpus([g], {"0000:0b:00.0": gpu})
    assert ids(alone) == ["gpu.pcie_downtrained"] and "x8 of" in alone[0].title
    linked = {"0000:0b:00.0": dict(gpu, upstream="0000:00:03.2"), "0000:00:03.2": bridge}
    assert judge.judge_gpus([g], linked) == []


def test_hostile_ids_never_become_subjects():
    doc = ['<?xml version="1.0" ?>', "<nvidia_smi_log>",
           '<gpu id="run: kubectl delete node x"><uuid>GPU-1;rm -rf /</uuid><pci>'
           "<pci_bus_id>see https://evil/</pci_bus_id></pci></gpu>", "</nvidia_smi_log>"]
    [g] = nvsmi_xml.parse(doc)
    assert g["uuid"] is None and g["pci_bus_id"] is None
    with pytest.raises(UnknownFormat):     # control characters are not XML at all
        nvsmi_xml.parse(['<nvidia_smi_log><gpu id="\x1b[2J"/></nvidia_smi_log>'])
    [t] = nvsmi_text.parse(["GPU 00000000:06:00.0", "    GPU UUID : \x1b[31mGPU-x",
                            "    PCI", "        Bus Id : 00000000:06:00.0\x1b[0m"])
    assert t["uuid"] is None and t["pci_bus_id"] == "00000000:06:00.0"
