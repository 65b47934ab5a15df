"""What an executor does next with an operation: one pure table from local state to action.

``next_step`` reads the operation and the two facts an executor keeps between actions (whether this
process itself recorded a SUBMITTING it has not sent yet, and which cancel generation it has sent)
and names the one action due. ``engine.runtime.driver.Driver.advance`` carries it out (the race
explorer runs that very driver, so there is no second copy of the table anywhere). Pure: no I/O, no clock, no state of its own; it decides no state either (``machine.step``
does, from the events the action's replies become).
"""

from __future__ import annotations

from enum import StrEnum

from engine.model import Epoch, LocalState, Operation

S = LocalState


class Step(StrEnum):
    """The one action an operation's local state calls for."""

    FENCED = "fenced"
    """Another execution epoch owns the operation: never talk to the server for it."""
    SUBMIT = "submit"
    """Send the create this process recorded and has not sent."""
    RESUME_SUBMITTING = "resume-submitting"
    """Found in SUBMITTING without a send of its own: it may have reached the server; never resend
    blindly, record SUBMISSION_UNKNOWN and look it up."""
    LOOK_UP = "lookup"
    """Find the submission by its key."""
    RESUBMIT = "resubmit"
    """The server proved it never created it: submit again under the same key."""
    POLL = "poll"
    """Read the task's status."""
    SEND_CANCEL = "cancel"
    """A cancel generation is recorded that this process has not sent."""
    FETCH_START = "fetch-start"
    """A terminal was observed (or outlived its expiry with a held outcome): start fetching."""
    FETCH = "fetch"
    """Fetch (or use the held copy of) the terminal result and verify it."""
    PROBE = "probe"
    """UNKNOWN with a task id and no terminal status: ask the server again now and then."""
    CANCEL_UNANSWERED = "cancel-unanswered"
    """No one answered the open input round by its deadline and the server takes a cancel: record
    a cancel (a request, never a local ending; polling follows the server to its real end)."""
    HAND_OVER_UNANSWERED = "hand-over-unanswered"
    """No one answered the open input round by its deadline and the server cannot take a cancel:
    open a reconciliation entry for a person (the server's own expiry ends the task), then wait."""
    WAIT = "wait"
    """A person acts next (an input round, UNKNOWN with nothing left to ask, or a submission a person
    declared absent, which only a person's resubmit sends again)."""
    DONE = "done"
    """The operation holds its receipt."""


def next_step(
    op: Operation,
    *,
    epoch: Epoch,
    fresh_submit: bool,
    cancel_sent: int,
    proved_absent: bool = False,
    round_expired: bool = False,
    can_cancel: bool = True,
) -> Step:
    """The action due for ``op`` for an executor at ``epoch`` that remembers ``fresh_submit``,
    ``cancel_sent`` and ``proved_absent`` (this process's own lookup proved the submission absent).
    The first two are lost on restart, by design: a restart resumes from the ledger alone (which
    holds the server's proof of absence, so the driver reads ``proved_absent`` back from it).
    ``round_expired`` (read from the ledger's approval record: the open round's deadline passed
    unanswered) and ``can_cancel`` (the server declared a cancel) decide an unanswered round."""
    if op.epoch != epoch:
        return Step.FENCED
    match op.state:
        case S.SUBMITTING:
            return Step.SUBMIT if fresh_submit else Step.RESUME_SUBMITTING
        case S.SUBMISSION_UNKNOWN:
            return Step.LOOK_UP
        case S.NOT_FOUND_SAFE:
            # Only the server's proof resubmits by itself (the driver remembers it, or reads it back
            # from the ledger's log after a restart): a person's "absent" waits for that person's
            # separate resubmit action.
            return Step.RESUBMIT if proved_absent else Step.WAIT
        case S.NEVER_CREATED:
            return Step.RESUBMIT
        case S.WORKING:
            return Step.POLL
        case S.CANCEL_REQUESTED:
            return Step.SEND_CANCEL if cancel_sent < op.cancel_generation else Step.POLL
        case S.INPUT_REQUIRED:
            if round_expired:
                # The seed: a cancel is a request, and a client that stops waiting has not
                # cancelled; a server that cannot take one leaves the decision to a person.
                return Step.CANCEL_UNANSWERED if can_cancel else Step.HAND_OVER_UNANSWERED
            return Step.WAIT
        case S.TERMINAL_OBSERVED | S.EXPIRED_WITH_RECEIPT:
            return Step.FETCH_START
        case S.FETCHING_RESULT:
            return Step.FETCH
        case S.UNKNOWN:
            if op.task_id is None or (op.server_status is not None and op.server_status.terminal):
                # Nothing to find (no server id), or the server already said how it ended and its
                # result could not be verified: asking again would only repeat the failure and
                # close the person's entry behind their back. A person decides.
                return Step.WAIT
            return Step.PROBE
        case S.ACCEPTED | S.CANCELLED_ACCEPTED:
            return Step.DONE


__all__ = [
    "Step",
    "next_step",
]
