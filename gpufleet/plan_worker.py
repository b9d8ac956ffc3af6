"""`gpufleet plan -i`'s preflight, in one process (issue 37): every targeted host's variables as Ansible gives them
to preflight's plays (its inventory, its vault, -e), each check of playbooks/preflight.yml run through the
collection's own functions (plugin_utils/preflight_checks.py, which the action plugins call), and each distinct
declaration templated and checked once however many hosts share it. No host is contacted.

A fleet has a handful of declarations: a value is templated once per distinct set of raw values it reads (itself
and every variable its templates name, followed through), so 1,000 hosts of two GPU classes cost two templatings
of the stack, not 1,000 forked tasks. A value that names a host's own variables (inventory_hostname, its
host_vars) is templated for that host; one that looks something up is templated for every host.

Run by gpufleet.fleet_plan with the environment a playbook run gets (the operator's Ansible configuration under
the project's), so Ansible's settings are read here exactly as ansible-playbook reads them. It reads the request
as JSON on stdin (the vault password travels there, never in the environment or on a command line) and writes
the hosts' results as JSON on stdout.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2
import jinja2.nodes

from gpufleet import PROJECT_ROOT

PLAYBOOK = PROJECT_ROOT / "playbooks" / "preflight.yml"
CAPACITY_TASKS = PROJECT_ROOT / "roles" / "vllm_service" / "tasks" / "capacity.yml"
MODELS_TASK = "Name the model tarballs each host stages"
MODELS_FACT = "gpufleet_preflight_models"
# A template that looks a value up may read any variable (lookup('vars', ...)): it is templated for every host.
LOOKUPS = ("lookup(", "query(", "q(")
PRIMITIVES = (str, int, float, bool, type(None))
# What a key holds for a name no variable has (a template's own loop variable, an undefined one).
UNSET = object()


class Identity:
    """A value compared by identity (and kept alive, so that its id is never reused by another)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identity) and other.value is self.value


class Declarations:
    """Templates each host's values, once per distinct set of raw values a value reads."""

    def __init__(self, templar: Any) -> None:
        from ansible.template import is_trusted_as_template

        self._templar = templar
        self._trusted = is_trusted_as_template
        # Parsing only (Ansible's delimiters are Jinja's): which names a template reads, never what it renders.
        self._parser = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
        self._names_in_text: dict[str, frozenset[str] | None] = {}
        self._names_in_object: dict[Identity, frozenset[str] | None] = {}
        self._templated: dict[tuple, tuple[bool, Any]] = {}

    def template(self, raw: Any, variables: Mapping[str, Any]) -> Any:
        """raw templated with `variables`; the AnsibleError Ansible raises, raised again for every host."""
        key = self.key(raw, variables)
        if key not in self._templated:
            self._templar.available_variables = variables
            try:
                self._templated[key] = (True, self._templar.template(raw))
            except Exception as error:  # an AnsibleError, or what a filter raised: the host's, not the plan's
                self._templated[key] = (False, error)
        ok, value = self._templated[key]
        if not ok:
            raise value
        return value

    def key(self, raw: Any, variables: Mapping[str, Any]) -> tuple:
        """What the templated value of raw depends on: raw and the raw value of every variable it reads."""
        names = self.names(raw)
        if names is None:
            return (Identity(raw), Identity(variables))
        seen: set[str] = set()
        pending = list(names)
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in variables:
                read = self.names(variables[name])
                if read is None:
                    return (Identity(raw), Identity(variables))
                pending.extend(read)
        return (self.marker(raw), *sorted((name, self.marker(variables.get(name, UNSET))) for name in seen))

    def marker(self, value: Any) -> Any:
        """Equal for values that template alike: plain values by type, content and trust, others by identity."""
        if isinstance(value, PRIMITIVES):
            return (type(value).__name__, value, isinstance(value, str) and self._trusted(value))
        return Identity(value)

    def names(self, value: Any) -> frozenset[str] | None:
        """The variables value's templates name (None: it looks something up, anything may be read)."""
        if isinstance(value, str):
            if value not in self._names_in_text:
                self._names_in_text[value] = self._names_in_template(value)
            return self._names_in_text[value]
        if isinstance(value, Mapping):
            return self._names_in_items(value, [*value.keys(), *value.values()])
        if isinstance(value, (list, tuple)):
            return self._names_in_items(value, value)
        return frozenset()

    def _names_in_items(self, container: Any, items: Iterable[Any]) -> frozenset[str] | None:
        identity = Identity(container)
        if identity not in self._names_in_object:
            found: set[str] = set()
            for item in items:
                names = self.names(item)
                if names is None:
                    self._names_in_object[identity] = None
                    return None
                found |= names
            self._names_in_object[identity] = frozenset(found)
        return self._names_in_object[identity]

    def _names_in_template(self, text: str) -> frozenset[str] | None:
        if "{{" not in text and "{%" not in text:
            return frozenset()
        if any(call in text for call in LOOKUPS):
            return None
        try:
            tree = self._parser.parse(text)
        except jinja2.TemplateSyntaxError:  # a template that does not parse fails alike for every host that has it
            return frozenset()
        # Every name read (a loop's own variable too: one name too many only costs a templating).
        return frozenset(node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx == "load")


def ansible_setup(request: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """Ansible's loader (with the vault's secrets), inventory, variables and templar, as ansible-playbook sets them
    up from its command line and configuration."""
    from ansible import constants
    from ansible import context
    from ansible.cli import CLI
    from ansible.inventory.manager import InventoryManager
    from ansible.module_utils.common.collections import ImmutableDict
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecret
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    context.CLIARGS = ImmutableDict(extra_vars=tuple(f"@{path}" for path in request["var_files"]))
    loader = DataLoader()
    loader.set_basedir(str(PLAYBOOK.parent))
    secrets = CLI.setup_vault_secrets(
        loader,
        vault_ids=list(constants.DEFAULT_VAULT_IDENTITY_LIST),
        vault_password_files=list(request["vault_password_files"]),
        ask_vault_pass=False,
        auto_prompt=False,
    )
    if request["vault_password"]:
        secrets.append(("default", VaultSecret(request["vault_password"].encode())))
    loader.set_vault_secrets(secrets)
    inventory = InventoryManager(loader=loader, sources=[request["inventory"]])
    if request["limit"]:
        inventory.subset(request["limit"])
    variables = VariableManager(loader=loader, inventory=inventory)
    return loader, inventory, variables, Templar(loader=loader)


def preflight_expressions(loader: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The templates preflight's tasks give: the model tarballs' fact (playbooks/preflight.yml) and capacity_check's
    arguments (roles/vllm_service/tasks/capacity.yml), read from the files so the plan follows them."""
    plays = loader.load_from_file(str(PLAYBOOK), trusted_as_template=True)
    (models,) = [
        task["ansible.builtin.set_fact"][MODELS_FACT]
        for play in plays
        for task in play.get("tasks", [])
        if task.get("name") == MODELS_TASK
    ]
    (capacity,) = [
        task["gpufleet.fleet.capacity_check"]
        for task in loader.load_from_file(str(CAPACITY_TASKS), trusted_as_template=True)
    ]
    return dict(models), dict(capacity)


def load_collections() -> None:
    """Ansible's collection loader on the configured collections path, before the collection is imported (its
    filters are found through it)."""
    from ansible import constants
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader(constants.COLLECTIONS_PATHS)


def main() -> int:
    request = json.load(sys.stdin)
    load_collections()
    try:
        document = plan_hosts(request)
    except Exception as error:  # Ansible's own error (a vault password missing, an inventory it cannot read)
        document = {"error": " ".join(str(error).split())}
    json.dump(document, sys.stdout)
    return 0


class Shared:
    """Results that many hosts share, written once: a host names them by index."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._index: dict[Identity, int] = {}

    def index(self, item: Any) -> int:
        identity = Identity(item)
        if identity not in self._index:
            self._index[identity] = len(self.items)
            self.items.append(item)
        return self._index[identity]


class Checks:
    """preflight's checks through the collection's functions, each run once per distinct templated input."""

    def __init__(self, declarations: Declarations) -> None:
        from gpufleet import collection

        self.functions = collection.plugin_util("preflight_checks")
        self.plain = collection.plugin_util("stack_resolve").plain
        self.kb_dir = collection.plugin_util("stack_resolve").kb_dir
        self.declarations = declarations
        self._memo: dict[tuple, Any] = {}

    def once(self, key: tuple, compute: Any) -> Any:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def marks(self, values: Mapping[str, Any]) -> tuple:
        return tuple((name, self.declarations.marker(value)) for name, value in values.items())

    def stack(self, values: dict[str, Any], host: str, groups: list[str], inventory_dir: str) -> dict[str, Any]:
        """stack_validate's result; computed again for a host whose inventory contradicts its stack (the message
        names the host and where each value is set)."""
        shared = self.once(
            ("stack", self.marks(values)), lambda: self.functions.stack_result(values, "", [], inventory_dir)
        )
        if not shared.get("conflicts"):
            return shared
        return self.functions.stack_result(values, host, groups, inventory_dir)

    def role_problems(self, role: str, values: dict[str, Any]) -> list[str]:
        """role_values' lines, option by option (each is checked on its own): a value that differs per host (a
        name built from inventory_hostname) costs that host one option's check, not the role's."""
        return [
            line
            for option, value in values.items()
            for line in self.once(
                ("role", role, option, self.declarations.marker(value)),
                lambda: self.functions.role_problems(role, {option: value}),
            )
        ]

    def capacity(self, stack: Any, arguments: dict[str, Any], host: str) -> list[dict[str, Any]]:
        def compute() -> list[dict[str, Any]]:
            checks, gpus = self.functions.capacity_checks(
                self.plain(stack),
                arguments["instances"],
                arguments["instance_defaults"],
                arguments["models"],
                self.kb_dir(),
            )
            return self.functions.capacity_result(host, checks, gpus)["capacity"]

        return self.once(("capacity", self.declarations.marker(stack), self.marks(arguments)), compute)


def plan_hosts(request: dict[str, Any]) -> dict[str, Any]:
    from ansible.errors import AnsibleError
    from ansible.template import trust_as_template
    from ansible.vars.hostvars import HostVars

    loader, inventory, variable_manager, templar = ansible_setup(request)
    declarations = Declarations(templar)
    checks = Checks(declarations)
    models_fact, capacity_args = preflight_expressions(loader)
    service_defaults = loader.load_from_file(
        str(PROJECT_ROOT / "roles" / "vllm_service" / "defaults" / "main.yml"), trusted_as_template=True
    )
    derived = {
        role: {
            name: trust_as_template(default)
            for name, default in checks.functions.role_defaults(role).items()
            if checks.functions.derived_default(default)
        }
        for role in checks.functions.declared_roles()
    }
    hostvars = HostVars(inventory=inventory, variable_manager=variable_manager, loader=loader)
    shared = Shared()
    hosts = []
    for host in inventory.get_hosts("gpu_nodes"):
        variables = variable_manager.get_vars(host=host, include_hostvars=False)
        variables["hostvars"] = hostvars
        name = host.get_name()
        plan: dict[str, Any] = {"host": name, "capacity": None, "models": None}
        try:
            stack_values = {
                key: declarations.template(variables[key], variables)
                for key in checks.functions.STACK_VARIABLES
                if key in variables
            }
        except AnsibleError as error:
            if "vault" in error.message:
                raise  # the inventory's secrets cannot be read: no host can be planned
            plan.update(ok=False, message=error.message, result=shared.index({"msg": error.message}))
            hosts.append(plan)
            continue
        result = checks.stack(stack_values, name, list(variables["group_names"]), variables.get("inventory_dir", ""))
        plan.update(ok=not result.get("failed"), message=str(result.get("msg", "")), result=shared.index(result))
        problems = [
            f"{name}: {line}"
            for role in checks.functions.declared_roles()
            for line in checks.role_problems(role, role_values(checks, declarations, derived[role], role, variables))
        ]
        if problems and plan["ok"]:
            plan.update(ok=False, message="\n".join(problems))
        if plan["ok"]:
            plan["models"] = shared.index(declarations.template(models_fact, variables))
            with_defaults = {**service_defaults, **variables}
            arguments = {key: declarations.template(value, with_defaults) for key, value in capacity_args.items()}
            plan["capacity"] = shared.index(checks.capacity(stack_values.get("gpufleet_stack"), arguments, name))
        hosts.append(plan)
    plain = checks.plain
    return {"shared": [plain(item) for item in shared.items], "hosts": sorted(hosts, key=lambda item: item["host"])}


def role_values(
    checks: Checks, declarations: Declarations, derived: dict[str, Any], role: str, variables: Mapping[str, Any]
) -> dict[str, Any]:
    """role_values' values of one role for a host: the options the inventory sets, and the derived defaults."""
    from ansible.errors import AnsibleError

    values: dict[str, Any] = {}
    for option in checks.functions.role_options(role):
        if option in variables:
            raw = variables[option]
        elif option in derived:
            raw = derived[option]
        else:
            continue
        try:
            values[option] = declarations.template(raw, variables)
        except AnsibleError:
            continue  # undefined here: the role reports it with its own context when it runs
    return values


if __name__ == "__main__":
    sys.exit(main())
