from vllm_tt_sampling.decision import SamplingDecision, SamplingPath, SamplingStats

DEVICE = SamplingDecision(SamplingPath.DEVICE, "device")
MIN_P = SamplingDecision(SamplingPath.HOST, "min_p")
BIAS = SamplingDecision(SamplingPath.HOST, "logit_bias")


def test_counts_by_path_and_reason():
    stats = SamplingStats()
    for decision in (DEVICE, DEVICE, MIN_P, BIAS, MIN_P):
        stats.record(decision)
    assert stats.total == 5
    assert stats.count("device") == 2
    assert stats.count("host") == 3
    assert stats.count(reason="min_p") == 2
    assert stats.as_dict() == {"device": 2, "host:logit_bias": 1, "host:min_p": 2}
    assert stats.summary() == "device=2 host=3 (logit_bias=1, min_p=2)"


def test_reset():
    stats = SamplingStats()
    stats.record(MIN_P)
    stats.reset()
    assert stats.total == 0
    assert stats.summary() == "device=0 host=0"


def test_verify_steps_verified_on_device_are_counted_apart():
    stats = SamplingStats()
    for decision in (DEVICE, SamplingDecision(SamplingPath.DEVICE, "verify"),
                     SamplingDecision(SamplingPath.HOST, "verify_sampled")):
        stats.record(decision)
    assert stats.as_dict() == {"device": 1, "device:verify": 1, "host:verify_sampled": 1}
    assert stats.summary() == "device=2 (verify=1) host=1 (verify_sampled=1)"
