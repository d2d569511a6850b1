"""Request fields -> SamplingParams: the sampling fields chat and text completions share, and the constraint
(response_format, structured_outputs, or the tool-call grammar) as a StructuredOutputParams."""

from __future__ import annotations

from vlchat.app.api.protocol import ResponseFormat, SamplingFields
from vlchat.app.errors import AppError
from vlchat.app.generation import sampling_params
from vlchat.app.settings import ServerConfig
from vlchat.llm import SamplingParams, StructuredOutputParams


def structured_output(fields: SamplingFields, response_format: ResponseFormat | None) -> StructuredOutputParams | None:
    """The one constraint a request asks for; two at once is a 400 naming both."""
    given = []
    if response_format is not None and response_format.type != "text":
        given.append(("response_format", _from_response_format(response_format)))
    if fields.structured_outputs is not None:
        so = fields.structured_outputs
        kinds = {"regex": so.regex, "choice": so.choice, "json": so.json_, "grammar": so.grammar}
        named = [k for k, v in kinds.items() if v is not None]
        if len(named) != 1:
            message = f"structured_outputs takes exactly one of regex, choice, json, grammar; got {named or 'none'}"
            raise AppError(message, param="structured_outputs")
        spec = {"json_schema" if named[0] == "json" else named[0]: kinds[named[0]]}
        given.append(("structured_outputs", _spec(spec, "structured_outputs")))
    if len(given) > 1:
        raise AppError("response_format and structured_outputs both constrain the answer; send one",
                       param="structured_outputs")  # fmt: skip
    return given[0][1] if given else None


def _from_response_format(fmt: ResponseFormat) -> StructuredOutputParams:
    if fmt.type == "json_object":
        return _spec({"json_object": True}, "response_format")
    schema = fmt.json_schema.schema_
    # no schema: any JSON value the name describes; OpenAI requires one, an empty schema allows any JSON
    return _spec({"json_schema": schema if schema is not None else {}}, "response_format")


def _spec(fields: dict, param: str) -> StructuredOutputParams:
    try:
        return StructuredOutputParams(**fields)
    except Exception as exc:  # InvalidRequestError: say which field it came from
        raise AppError(f"{param}: {exc}", param=param) from None


def build_params(config: ServerConfig, body: SamplingFields, *, max_tokens: int | None, logprobs: int | None,
                 constraint: StructuredOutputParams | None) -> SamplingParams:  # fmt: skip
    """SamplingParams of a request; an engine-side refusal (a bad combination) is a 400 naming the field."""
    bias = {int(k): float(v) for k, v in (body.logit_bias or {}).items()}
    try:
        return sampling_params(
            config.sampling_defaults,
            n=body.n,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            min_p=body.min_p,
            repetition_penalty=body.repetition_penalty,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            logit_bias=bias or None,
            seed=body.seed,
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            stop=body.stop_list or None,
            stop_token_ids=body.stop_token_ids,
            ignore_eos=body.ignore_eos or None,
            logprobs=logprobs,
            structured_output=constraint,
        )
    except AppError:
        raise
    except Exception as exc:
        message = str(exc)
        param = next((f for f in ("ignore_eos", "min_tokens", "logit_bias", "stop_token_ids", "logprobs")
                      if f in message), None)  # fmt: skip
        raise AppError(message, param=param) from None
