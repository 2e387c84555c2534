"""What a request sent to a worker came to: applied, duplicate, refused or unanswered."""

from __future__ import annotations

from supervisor.client.control import result_of
from supervisor.errors import ControlError
from worker.ipc.wire import Message


def take_replies(
    replies: list[Message], frames: dict[int, bytes], answers: dict[int, Message]
) -> None:
    """Record each reply to one of ``frames`` as its request's answer."""
    for reply in replies:
        request_id = reply.get("id")
        if type(request_id) is int and request_id in frames:
            answers[request_id] = reply


def outcome_of(reply: Message, key: object) -> Message:
    """A request's outcome from its reply (``send_many``'s docstring)."""
    try:
        result = result_of(reply)
    except ControlError as exc:
        failure = reply.get("error")
        before_write = isinstance(failure, dict) and failure.get("before_write") is True
        # A not_owner sent after the fsync (or by a worker that does not say when) may be
        # of a durable request: unknown, to be sent again by key at the session's owner.
        known = exc.code != "not_owner" or before_write
        return {
            "outcome": "refused" if known else "unanswered",
            "key": key,
            "error": {"code": exc.code, "message": exc.message},
        }
    outcome: Message = dict(result) if isinstance(result, dict) else {"result": result}
    outcome.setdefault("key", key)
    outcome["outcome"] = "duplicate" if outcome.get("duplicate") is True else "applied"
    return outcome


def unanswered(failure: ControlError, key: object) -> Message:
    error = {"code": failure.code, "message": failure.message}
    return {"outcome": "unanswered", "key": key, "error": error}


def result_or_raise(outcome: Message) -> Message:
    """``send``'s answer from an outcome: the worker's result, or its error raised."""
    if outcome["outcome"] in ("refused", "unanswered"):
        error = outcome["error"]
        assert isinstance(error, dict)
        raise ControlError(str(error["code"]), str(error["message"]))
    return {k: v for k, v in outcome.items() if k != "outcome"}
