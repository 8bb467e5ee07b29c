"""The slow-GPU judges on records (the contract in node_probe/checks/slow/__init__.py).

The records here are what the NVML child / sysfs reader / offline parsers produce; the causes
are the ones public reports established:
- a GPU at PCIe Gen2 x16 at 100 % utilisation for 3.5 h of training, nothing logged
  (https://github.com/local-inference-lab/rtx6kpro/pull/88);
- idle NVIDIA GPUs drop the link generation by design: nvidia-smi's documentation of "GPU Link
  information - current": "These may be reduced when the GPU is not in use", and NVIDIA's
  answer "Downgrading the PCIe link when not in use is an important integral part of the GPU's
  power management" (https://forums.developer.nvidia.com/t/prevent-pcie-from-reducing-gen/72537);
- clock event reason bits: nvml.h / https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html.
Proven only on records and the stand-in library: no real GPU was at hand.
"""
from node_probe.checks.slow import clocks, judge, nvlink, pcie

UUID = "GPU-2f815c32-768d-d782-1073-db01d7b90215"


def gpu(**kw):
    g = {"index": 0, "uuid": UUID, "name": "NVIDIA H100 80GB HBM3",
         "pci_bus_id": "00000000:3B:00.0", "utilization_gpu_pct": 100,
         "processes": [{"pid": 4242, "used_memory_bytes": 1 << 34}],
         "pcie": {"gen_cur": 5, "width_cur": 16, "gen_max": 5, "width_max": 16,
                  "gen_gpu_max": 5},
         "clocks": {"event_reasons": 0, "sm_mhz": 1980, "sm_max_mhz": 1980,
                    "mem_mhz": 2619, "mem_max_mhz": 2619},
         "temperature": {"gpu_c": 61, "slowdown_c": 87, "shutdown_c": 92},
         "power": {"draw_w": 650.0, "limit_w": 700.0, "default_limit_w": 700.0},
         "nvlink": [{"link": i, "active": True, "errors": {"replay": 0, "recovery": 0,
                                                          "crc_flit": 0, "crc_data": 0}}
                    for i in range(18)],
         "ecc": {"sbe_volatile": 0, "dbe_volatile": 0, "retired_pending": False}}
    g.update(kw)
    return g


def idle(**kw):
    return gpu(utilization_gpu_pct=0, processes=[], **kw)


def test_a_healthy_busy_gpu_raises_nothing():
    assert judge.judge_gpus([gpu(), gpu(index=1, uuid="GPU-b")]) == []


def test_an_idle_gpu_at_gen1_raises_nothing():
    g = idle(pcie={"gen_cur": 1, "width_cur": 16, "gen_max": 5, "width_max": 16})
    assert judge.judge_gpus([g]) == []


def test_an_idle_process_holding_a_context_at_gen1_raises_nothing():
    # utilisation 0 % with a process: the GPU idles (and its link with it) all the same
    g = gpu(utilization_gpu_pct=0,
            pcie={"gen_cur": 1, "width_cur": 16, "gen_max": 5, "width_max": 16})
    assert g["processes"] and judge.judge_gpus([g]) == []


def test_processes_count_as_busy_only_without_utilisation():
    g = gpu(utilization_gpu_pct=None,
            pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5, "width_max": 16})
    [f] = judge.judge_gpus([g])
    assert f.evidence["generation_low"]


def test_unknown_busyness_never_judges_the_generation():
    g = gpu(utilization_gpu_pct=None, processes=None,
            pcie={"gen_cur": 1, "width_cur": 16, "gen_max": 5, "width_max": 16})
    assert judge.judge_gpus([g]) == []


def test_busy_gen2_x16_of_gen5_is_one_eighth_of_host_bandwidth():
    g = gpu(pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5, "width_max": 16})
    [f] = judge.judge_gpus([g], holders={UUID: ["team-a/train-0"]})
    assert f.id == "gpu.pcie_downtrained" and f.severity.value == "warning"
    assert "Gen2 x16 of Gen5 x16: 1/8 of host bandwidth" in f.title
    assert "team-a/train-0" in f.title and f.evidence["pods"] == ["team-a/train-0"]
    assert f.evidence["pci_bus_id"] == "00000000:3B:00.0" and f.subject == UUID


def test_width_below_max_is_wrong_even_when_idle():
    g = idle(pcie={"gen_cur": 1, "width_cur": 8, "gen_max": 4, "width_max": 16})
    [f] = judge.judge_gpus([g])
    assert f.evidence["width_low"] and not f.evidence["generation_low"]
    assert "Gen4 x8 of Gen4 x16: 1/2 of host bandwidth" in f.title


def test_slot_limited_gpu_is_not_downtrained():
    # a Gen5 GPU in a Gen4 slot: NVML's max (GPU and system) is Gen4; the GPU's own is Gen5
    g = gpu(pcie={"gen_cur": 4, "width_cur": 16, "gen_max": 4, "width_max": 16,
                  "gen_gpu_max": 5})
    assert judge.judge_gpus([g]) == []


def test_sysfs_bridge_above_the_gpu_downtrained():
    links = [{"bdf": "0000:3b:00.0", "speed_cur_gts": 32.0, "width_cur": 16,
              "speed_max_gts": 32.0, "width_max": 16, "upstream": "0000:3a:00.0"},
             {"bdf": "0000:3a:00.0", "speed_cur_gts": 32.0, "width_cur": 16,
              "speed_max_gts": 32.0, "width_max": 16, "upstream": "0000:39:00.0"},
             {"bdf": "0000:39:00.0", "speed_cur_gts": 8.0, "width_cur": 16,
              "speed_max_gts": 32.0, "width_max": 16, "upstream": "0000:38:00.0"},
             {"bdf": "0000:38:00.0", "speed_cur_gts": 32.0, "width_cur": 16,
              "speed_max_gts": 32.0, "width_max": 16, "upstream": None}]
    g = gpu(pcie={})
    [f] = judge.judge_gpus([g], links=links)
    assert f.evidence["at"] == "bridge" and f.evidence["at_bdf"] == "0000:39:00.0"
    assert "Gen3 x16 of Gen5 x16" in f.title
    # the same tree idle: nothing
    assert judge.judge_gpus([idle(pcie={})], links=links) == []


def test_share_words():
    assert pcie.share(2, 16, 5, 16)[1] == "1/8"
    assert pcie.share(4, 16, 5, 16)[1] == "1/2"
    assert pcie.share(5, 8, 5, 16)[1] == "1/2"
    assert pcie.gen_of(2.5) == 1 and pcie.gen_of(64.0) == 6 and pcie.gen_of(3.0) is None


def test_idle_and_application_clock_reasons_raise_nothing():
    for mask in (clocks.GPU_IDLE, clocks.APPLICATIONS_CLOCKS_SETTING,
                 clocks.GPU_IDLE | clocks.APPLICATIONS_CLOCKS_SETTING, clocks.SYNC_BOOST,
                 clocks.DISPLAY_CLOCK_SETTING):
        g = gpu(clocks={"event_reasons": mask, "sm_mhz": 1410, "sm_max_mhz": 1980})
        assert judge.judge_gpus([g]) == [], hex(mask)


def test_idle_gpu_with_thermal_reason_raises_nothing():
    g = idle(clocks={"event_reasons": clocks.HW_THERMAL, "sm_mhz": 345, "sm_max_mhz": 1980})
    assert judge.judge_gpus([g]) == []


def test_hw_thermal_under_load_names_margin_and_clock():
    g = gpu(clocks={"event_reasons": clocks.HW_THERMAL | clocks.SW_THERMAL, "sm_mhz": 990,
                    "sm_max_mhz": 1980},
            temperature={"gpu_c": 86, "slowdown_c": 87, "shutdown_c": 92})
    [f] = judge.judge_gpus([g])
    assert f.id == "gpu.clocks_throttled" and f.evidence["cause"] == "thermal"
    assert f.evidence["thermal_margin_c"] == 1
    assert "HW thermal slowdown" in f.title and "SM 990 of 1980 MHz" in f.title
    assert "Cooling" in f.remediation


def test_sw_power_cap_at_default_limit_and_full_clock_is_normal():
    g = gpu(clocks={"event_reasons": clocks.SW_POWER_CAP, "sm_mhz": 1900,
                    "sm_max_mhz": 1980})
    assert judge.judge_gpus([g]) == []


def test_sw_power_cap_at_default_limit_under_heavy_load_is_by_design():
    # an H100 at its 700 W default limit runs below max boost under heavy work: not a fault
    g = gpu(clocks={"event_reasons": clocks.SW_POWER_CAP, "sm_mhz": 1600,
                    "sm_max_mhz": 1980},
            power={"draw_w": 699.0, "limit_w": 700.0, "default_limit_w": 700.0})
    assert judge.judge_gpus([g]) == []


def test_sw_power_cap_with_a_lowered_limit_is_said():
    g = gpu(clocks={"event_reasons": clocks.SW_POWER_CAP, "sm_mhz": 1200,
                    "sm_max_mhz": 1980},
            power={"draw_w": 399.0, "limit_w": 400.0, "default_limit_w": 700.0})
    [f] = judge.judge_gpus([g])
    assert f.evidence["power_limit_lowered"] and "of default 700 W" in f.title
    assert f.evidence["cause"] == "power"


def test_nvlink_fewer_active_than_peers():
    peer = gpu(index=1, uuid="GPU-peer")
    links = [{"link": i, "active": i != 3, "errors": {}} for i in range(18)]
    g = gpu(nvlink=links)
    [f] = judge.judge_gpus([g, peer])
    assert f.id == "gpu.nvlink_degraded" and f.evidence["links_down"] == [3]
    assert "17 of 18 NVLink links active" in f.title


def test_nvlink_counters_one_sample_says_only_nonzero():
    links = [{"link": 0, "active": True, "errors": {"replay": 5, "recovery": 0,
                                                    "crc_flit": 2, "crc_data": 0}}]
    g = gpu(nvlink=links)
    [f] = nvlink.judge(g, [g])
    assert f.severity.value == "info" and "cannot say whether" in f.title
    # two samples, the same counts: history, nothing
    assert nvlink.judge(g, [g], previous=g) == []
    later = gpu(nvlink=[{"link": 0, "active": True,
                         "errors": {"replay": 50, "recovery": 1, "crc_flit": 2,
                                    "crc_data": 0}}])
    [f2] = nvlink.judge(later, [later], previous=g)
    assert f2.severity.value == "warning" and f2.evidence["errors_rising"] == {
        "replay": 45, "recovery": 1}


def test_memory_pending_retirement_and_sbe_rising():
    g = gpu(ecc={"sbe_volatile": 12, "dbe_volatile": 0, "retired_pending": True})
    [f] = judge.judge_gpus([g])
    assert f.id == "gpu.memory_degrading" and f.evidence["sbe_rise"] is None
    before = gpu(ecc={"sbe_volatile": 10, "dbe_volatile": 0, "retired_pending": False})
    after = gpu(ecc={"sbe_volatile": 510, "dbe_volatile": 0, "retired_pending": False})
    assert judge.judge_gpus([before]) == []
    [f2] = judge.judge_gpus([after], previous=[before])
    assert f2.evidence["sbe_rise"] == 500


def test_missing_keys_mean_not_known_and_raise_nothing():
    g = {"index": 0, "uuid": UUID}
    assert judge.judge_gpus([g]) == []
