"""Current accounts and transfers between them (role "main").

One environment of the bed's banking domain (see ``__init__``). Stdlib only.
"""
from __future__ import annotations

import random

from domains._common import call as _call, check as _check, tool as _tool
from domains._draws import ids as _ids, people as _people, say as _say, pick as _pick


ACCOUNTS_CODE = '''\
class BankAccounts:
    def __init__(self, init_config: dict):
        """Current accounts. State: accounts: account_id -> {account_id, owner, balance} (whole euros);
        ledger: one entry per booking, in order."""
        self.accounts = {}
        self.ledger = []

    def _check(self, account_id, amount):
        if str(account_id) not in self.accounts:
            return f"unknown account {account_id}"
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return "amount must be a positive whole number"
        return None

    def find_accounts(self, owner: str) -> dict:
        """Accounts whose owner name contains ``owner`` (case-insensitive)."""
        q = str(owner).lower()
        return {"success": True, "data": [a for a in self.accounts.values() if q in a["owner"].lower()]}

    def deposit(self, account_id: str, amount: int) -> dict:
        """Pay ``amount`` into the account."""
        error = self._check(account_id, amount)
        if error:
            return {"success": False, "error": error}
        self.accounts[account_id]["balance"] += amount
        self.ledger.append(["deposit", account_id, amount])
        return {"success": True, "data": self.accounts[account_id]}

    def withdraw(self, account_id: str, amount: int) -> dict:
        """Take ``amount`` out of the account; fails above the balance."""
        error = self._check(account_id, amount)
        if error:
            return {"success": False, "error": error}
        if self.accounts[account_id]["balance"] < amount:
            return {"success": False, "error": f"insufficient funds in {account_id}"}
        self.accounts[account_id]["balance"] -= amount
        self.ledger.append(["withdraw", account_id, amount])
        return {"success": True, "data": self.accounts[account_id]}

    def transfer(self, source: str, target: str, amount: int) -> dict:
        """Move ``amount`` from the source account to the target account."""
        error = self._check(source, amount) or self._check(target, amount)
        if error:
            return {"success": False, "error": error}
        if source == target:
            return {"success": False, "error": "source and target are the same account"}
        if self.accounts[source]["balance"] < amount:
            return {"success": False, "error": f"insufficient funds in {source}"}
        self.accounts[source]["balance"] -= amount
        self.accounts[target]["balance"] += amount
        self.ledger.append(["transfer", source, target, amount])
        return {"success": True, "data": [self.accounts[source], self.accounts[target]]}
'''


def _accounts_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    ids = _ids(rng, "A", n)
    accounts = {a: {"account_id": a, "owner": o, "balance": rng.randint(50, 3000)}
                for a, o in zip(ids, _people(rng, n))}
    a, b = rng.sample(ids, 2)

    def balance_is(acc: str, value: int) -> dict:
        return _check(f"Is the balance of {acc} {value}?", f'final_state["accounts"]["{acc}"]["balance"] == {value}')

    def moved(src: str, dst: str, k: int) -> dict:
        s, d = accounts[src]["balance"] - k, accounts[dst]["balance"] + k
        return _check(f"Did {k} move from {src} to {dst}?",
                      f'final_state["accounts"]["{src}"]["balance"] == {s} and '
                      f'final_state["accounts"]["{dst}"]["balance"] == {d}')

    def some(acc: str) -> int:  # an amount the account can pay
        return rng.randint(1, min(accounts[acc]["balance"], 900) // 5) * 5

    def deposit() -> tuple:
        k = rng.randint(1, 200) * 5
        text = _say(rng, ["Deposit {k} euros into account {a}.", "Put {k} euros in cash into account {a}.",
                           "Credit account {a} with a deposit of {k}.", "A customer hands over {k} euros for account {a}. Book the deposit."], k=k, a=a)
        return text, [balance_is(a, accounts[a]["balance"] + k)], [_call("deposit", account_id=a, amount=k)]

    def withdraw() -> tuple:
        k = some(a)
        text = _say(rng, ["Withdraw {k} euros from account {a}.",
                          "The owner of account {a} takes out {k} euros in cash; record the withdrawal.",
                           "Pay out {k} euros from account {a}.", "Debit {k} euros from account {a} as a cash withdrawal."], k=k, a=a)
        return text, [balance_is(a, accounts[a]["balance"] - k)], [_call("withdraw", account_id=a, amount=k)]

    def transfer() -> tuple:
        k = some(a)
        text = _say(rng, ["Transfer {k} euros from account {a} to account {b}.", "Move {k} euros from {a} to {b}.",
                           "Send {k} euros from account {a} to account {b}.", "Account {b} should receive {k} euros from account {a}."], k=k, a=a, b=b)
        return text, [moved(a, b, k)], [_call("transfer", source=a, target=b, amount=k)]

    def find_deposit() -> tuple:
        k, owner = rng.randint(1, 200) * 5, accounts[a]["owner"]
        text = _say(rng, ["Find the account of {owner} and deposit {k} euros into it.",
                          "{owner} brought {k} euros in cash; look up their account and deposit the money.", "Search for the account owned by {owner}, then credit it with {k} euros.", "There is a cash deposit of {k} euros for {owner}. Which account is theirs? Put the money there."],
                    k=k, owner=owner)
        calls = [_call("find_accounts", owner=owner), _call("deposit", account_id=a, amount=k)]
        return text, [balance_is(a, accounts[a]["balance"] + k)], calls

    def find_transfer() -> tuple:
        k, owner = some(a), accounts[b]["owner"]
        text = _say(rng, ["Transfer {k} euros from account {a} to the account of {owner}.",
                          "Look up the account of {owner} and send it {k} euros from account {a}.", "{owner} is owed {k} euros from account {a}. Find where their account is and transfer it.", "Pay {k} euros out of account {a} into whichever account belongs to {owner}."],
                    k=k, a=a, owner=owner)
        calls = [_call("find_accounts", owner=owner), _call("transfer", source=a, target=b, amount=k)]
        return text, [moved(a, b, k)], calls

    def two() -> tuple:
        k, m = rng.randint(1, 200) * 5, some(b)
        text = _say(rng, ["Deposit {k} euros into {a} and withdraw {m} euros from {b}.",
                          "Withdraw {m} euros from account {b}, then deposit {k} euros into account {a}.", "Two cash jobs: account {a} gets a {k} euro deposit and account {b} a {m} euro withdrawal.", "Deposit: {k} euros to {a}. Withdrawal: {m} euros from {b}. Book both."],
                    k=k, m=m, a=a, b=b)
        calls = [_call("deposit", account_id=a, amount=k), _call("withdraw", account_id=b, amount=m)]
        checks = [balance_is(a, accounts[a]["balance"] + k), balance_is(b, accounts[b]["balance"] - m)]
        return text, checks, calls if text.startswith("Deposit") else calls[::-1]

    text, checks, calls = _pick(rng, [deposit, withdraw, transfer, find_deposit, find_transfer, two])()
    return {"init_config": {"accounts": accounts}, "task": text, "checklist_with_func": checks,
            "reference_actions": calls}


ACCOUNTS = {
    "env_id": "bed_banking_accounts",
    "env_class_name": "BankAccounts",
    "role": "main",
    "environment_introduction": "A bank's account desk: customer accounts with balances in whole euros.",
    "constraints_rules": ["Withdrawals and transfers cannot exceed the balance."],
    "tools": [
        _tool("find_accounts", "Find accounts by owner name.", owner="string"),
        _tool("deposit", "Pay money into an account.", account_id="string", amount="integer"),
        _tool("withdraw", "Take money out of an account.", account_id="string", amount="integer"),
        _tool("transfer", "Move money between accounts.", source="string", target="string", amount="integer"),
    ],
    "env_class_code": ACCOUNTS_CODE,
    "make_task": _accounts_task,
}
