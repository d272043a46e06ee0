"""A loan desk (role "transfer", used by no train task).

One environment of the bed's banking domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, people as _people, say as _say, pick as _pick


LOANS_CODE = '''\
class LoanDesk:
    def __init__(self, init_config: dict):
        """A loan desk. State: loans: loan_id -> {loan_id, borrower, balance, status} (active | closed);
        applications: app_id -> {app_id, applicant, amount, status} (pending | approved | rejected)."""
        self.loans = {}
        self.applications = {}

    def find_loans(self, borrower: str) -> dict:
        """Loans whose borrower name contains ``borrower`` (case-insensitive)."""
        q = str(borrower).lower()
        return {"success": True, "data": [x for x in self.loans.values() if q in x["borrower"].lower()]}

    def repay_loan(self, loan_id: str, amount: int) -> dict:
        """Record a repayment; a loan repaid in full is closed."""
        loan = self.loans.get(str(loan_id))
        if loan is None:
            return {"success": False, "error": f"unknown loan {loan_id}"}
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return {"success": False, "error": "amount must be a positive whole number"}
        if loan["status"] != "active" or amount > loan["balance"]:
            return {"success": False, "error": f"loan {loan_id} has {loan['balance']} left to repay"}
        loan["balance"] -= amount
        if loan["balance"] == 0:
            loan["status"] = "closed"
        return {"success": True, "data": loan}

    def _decide(self, app_id, status):
        app = self.applications.get(str(app_id))
        if app is None:
            return {"success": False, "error": f"unknown application {app_id}"}
        if app["status"] != "pending":
            return {"success": False, "error": f"application {app_id} is already {app['status']}"}
        app["status"] = status
        return {"success": True, "data": app}

    def approve_application(self, app_id: str) -> dict:
        """Approve a pending loan application."""
        return self._decide(app_id, "approved")

    def reject_application(self, app_id: str) -> dict:
        """Reject a pending loan application."""
        return self._decide(app_id, "rejected")
'''


def _loans_task(rng: random.Random) -> dict:
    n_loans, n_apps = rng.randint(3, 4), rng.randint(2, 3)
    people = _people(rng, n_loans + n_apps)
    loan_ids, app_ids = _ids(rng, "L", n_loans), _ids(rng, "Q", n_apps)
    loans = {x: {"loan_id": x, "borrower": p, "balance": rng.randint(10, 400) * 10, "status": "active"}
             for x, p in zip(loan_ids, people)}
    applications = {x: {"app_id": x, "applicant": p, "amount": rng.randint(5, 200) * 100, "status": "pending"}
                    for x, p in zip(app_ids, people[n_loans:])}
    if n_apps == 3:  # x and y stay pending
        applications[app_ids[-1]]["status"] = rng.choice(["pending", "approved", "rejected"])
    loan = rng.choice(loan_ids)
    x, y = app_ids[0], app_ids[1]
    bal = loans[loan]["balance"]

    def loan_is(balance: int) -> dict:
        return _check(f"Does loan {loan} have {balance} left?",
                      f'final_state["loans"]["{loan}"]["balance"] == {balance}')

    def closed() -> dict:
        return _check(f"Is loan {loan} repaid and closed?",
                      f'final_state["loans"]["{loan}"]["balance"] == 0 and '
                      f'final_state["loans"]["{loan}"]["status"] == "closed"')

    def decided(app: str, status: str) -> dict:
        return _check(f"Is application {app} {status}?",
                      f'final_state["applications"]["{app}"]["status"] == "{status}"')

    def repay() -> tuple:
        k = rng.randint(1, bal // 10 - 1) * 10
        text = _say(rng, ["Record a repayment of {k} euros on loan {loan}.",
                          "Loan {loan}: the borrower paid back {k} euros; record it."], k=k, loan=loan)
        return text, [loan_is(bal - k)], [_call("repay_loan", loan_id=loan, amount=k)]

    def approve() -> tuple:
        text = _say(rng, ["Approve loan application {x}.", "Application {x} passed the credit check; approve it."],
                    x=x)
        return text, [decided(x, "approved")], [_call("approve_application", app_id=x)]

    def reject() -> tuple:
        text = _say(rng, ["Reject loan application {x}.", "Application {x} failed the credit check; reject it."], x=x)
        return text, [decided(x, "rejected")], [_call("reject_application", app_id=x)]

    def find_repay() -> tuple:
        k, who = rng.randint(1, bal // 10 - 1) * 10, loans[loan]["borrower"]
        text = _say(rng, ["{who} paid {k} euros towards their loan. Find the loan and record the repayment.",
                           "Look up the loan of {who} and record a repayment of {k} euros."], k=k, who=who)
        calls = [_call("find_loans", borrower=who), _call("repay_loan", loan_id=loan, amount=k)]
        return text, [loan_is(bal - k)], calls

    def find_close() -> tuple:
        who = loans[loan]["borrower"]
        text = _say(rng, ["{who} repaid the remaining {bal} euros of their loan. Find the loan and record it.",
                          "Look up the loan of {who} and record the final repayment of {bal} euros."],
                    bal=bal, who=who)
        return text, [closed()], [_call("find_loans", borrower=who), _call("repay_loan", loan_id=loan, amount=bal)]

    def two() -> tuple:
        text = _say(rng, ["Approve application {x} and reject application {y}.",
                           "Reject loan application {y}, then approve application {x}."], x=x, y=y)
        calls = [_call("approve_application", app_id=x), _call("reject_application", app_id=y)]
        checks = [decided(x, "approved"), decided(y, "rejected")]
        return text, checks, calls if text.startswith("Approve") else calls[::-1]

    text, checks, calls = _pick(rng, [repay, approve, reject, find_repay, find_close, two])()
    return {"init_config": {"loans": loans, "applications": applications}, "task": text,
            "checklist_with_func": checks, "reference_actions": calls}


LOANS = {
    "env_id": "bed_banking_loans",
    "env_class_name": "LoanDesk",
    "role": "transfer",
    "environment_introduction": "A bank's loan desk: loans with a balance left to repay, and loan applications.",
    "constraints_rules": ["A repayment cannot exceed the loan balance.", "Only pending applications can be decided."],
    "tools": [
        _tool("find_loans", "Find loans by borrower name.", borrower="string"),
        _tool("repay_loan", "Record a loan repayment.", loan_id="string", amount="integer"),
        _tool("approve_application", "Approve a loan application.", app_id="string"),
        _tool("reject_application", "Reject a loan application.", app_id="string"),
    ],
    "env_class_code": LOANS_CODE,
    "make_task": _loans_task,
}
