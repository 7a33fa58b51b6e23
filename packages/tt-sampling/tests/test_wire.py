"""``to_device_params``: vLLM params -> the TTSamplingParams wire rows."""

from vllm import SamplingParams
from vllm_tt_sampling.decision import to_device_params
from vllm_tt_sampling.params import NO_LOGPROBS, TTSamplingParams

VOCAB = 1000


def one(params: SamplingParams) -> dict:
    wire = to_device_params([params], VOCAB)
    return {name: values[0] for name, values in vars(wire).items()}


def test_padding_rows_are_neutral():
    wire = to_device_params([None, None], VOCAB)
    assert wire == TTSamplingParams.neutral(2)


def test_greedy_row():
    row = one(SamplingParams(temperature=0.0))
    assert (row["temperature"], row["top_k"], row["top_p"]) == (0.0, 1, 0.0)


def test_tiny_temperature_is_greedy():
    # vLLM clamps 0 < t < 0.01 up to 0.01, but anything below its epsilon is greedy.
    params = SamplingParams(temperature=0.5)
    params.temperature = 1e-6
    assert one(params)["temperature"] == 0.0


def test_sampling_row_passes_values_through():
    row = one(
        SamplingParams(
            temperature=0.7,
            top_k=20,
            top_p=0.9,
            presence_penalty=0.1,
            frequency_penalty=0.2,
            repetition_penalty=1.3,
            seed=-5,
            logprobs=0,
        )
    )
    assert row == {
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.9,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.3,
        "seed": -5,
        "num_logprobs": 0,
        "enable_log_probs": True,
    }


def test_disabled_or_huge_top_k_becomes_vocab():
    assert one(SamplingParams(top_k=0))["top_k"] == VOCAB
    assert one(SamplingParams(top_k=-1))["top_k"] == VOCAB
    assert one(SamplingParams(top_k=VOCAB + 5))["top_k"] == VOCAB


def test_top_k_one_forces_top_p_zero():
    assert one(SamplingParams(top_k=1, top_p=0.8))["top_p"] == 0.0


def test_logprob_sentinels():
    assert one(SamplingParams())["num_logprobs"] == NO_LOGPROBS
    assert one(SamplingParams())["enable_log_probs"] is False
    assert one(SamplingParams(logprobs=-1))["num_logprobs"] == VOCAB
    assert one(SamplingParams(logprobs=4))["num_logprobs"] == 4


def test_rows_keep_order():
    wire = to_device_params([SamplingParams(seed=1), None, SamplingParams(seed=3)], VOCAB)
    assert wire.seed == [1, None, 3]
    assert len(wire) == 3
