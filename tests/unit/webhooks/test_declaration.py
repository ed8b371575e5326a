"""Registration of validators, mutators and converters (declop/webhooks/declaration.py, the registry)."""

from __future__ import annotations

import pytest

import declop
from declop.registry import Registry
from declop.webhooks.declaration import Rejected, default_name


def test_validator_is_registered_and_returned_unchanged():
    reg = Registry()

    def check_size(obj, dry_run, **_):
        return None

    assert declop.validator("widgets.example.com", registry=reg)(check_size) is check_size
    (hook,) = reg.webhooks
    assert hook.kind == "validator"
    assert hook.name == "check-size.widgets.example.com"
    assert hook.path == "/validate/check-size.widgets.example.com"
    assert hook.operations == ("CREATE", "UPDATE")
    assert hook.failure_policy == "Fail" and hook.timeout == 10
    assert hook.wants is None  # **_ gets everything


def test_declared_arguments_only():
    reg = Registry()

    @declop.mutator("configmaps", operations=["create"], timeout=3, failure_policy="Ignore", registry=reg)
    async def add_label(obj, logger):
        return None

    (hook,) = reg.webhooks
    assert hook.is_async and hook.wants == {"obj", "logger"}
    assert hook.name == "add-label.configmaps.core"
    assert hook.operations == ("CREATE",) and hook.timeout == 3 and hook.failure_policy == "Ignore"
    assert hook.arguments({"obj": 1, "logger": 2, "dry_run": 3}) == {"obj": 1, "logger": 2}


def test_unknown_argument_gets_did_you_mean():
    reg = Registry()
    with pytest.raises(declop.errors.RegistrationError, match=r"unknown argument 'old_object': did you mean 'old_obj'\?"):
        declop.validator("widgets.example.com", registry=reg)(lambda obj, old_object: None)


def test_defaulted_typo_is_refused():
    reg = Registry()

    def fn(obj, dryrun=False):
        return None

    with pytest.raises(declop.errors.RegistrationError, match=r"'dryrun', which would always keep its default: did you mean 'dry_run'"):
        declop.validator("widgets.example.com", registry=reg)(fn)


def test_converter_arguments_are_its_own():
    reg = Registry()
    with pytest.raises(declop.errors.RegistrationError, match=r"@declop.converter .* unknown argument 'operation'"):
        declop.converter("widgets.example.com", registry=reg)(lambda obj, operation: None)

    @declop.converter("widgets.example.com", registry=reg)
    def convert(obj, desired_api_version):
        return obj

    assert reg.webhooks[0].path == "/convert/convert.widgets.example.com"
    with pytest.raises(declop.errors.RegistrationError, match="already has a converter"):
        declop.converter("widgets.example.com", name="other.widgets.example.com", registry=reg)(lambda obj: obj)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"operations": ("CREATE", "PATCH")}, "operations must be some of CREATE, UPDATE, DELETE, CONNECT"),
        ({"operations": ()}, "operations must be some of"),
        ({"failure_policy": "fail"}, "failure_policy='fail': did you mean 'Fail'\\?"),
        ({"timeout": 31}, "timeout must be whole seconds from 1 to 30"),
        ({"timeout": 2.5}, "timeout must be whole seconds"),
        ({"name": "check"}, "is not a qualified name"),
        ({"system_namespaces": "yes"}, "system_namespaces must be True or False, got 'yes'"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(declop.errors.RegistrationError, match=message):
        declop.validator("widgets.example.com", registry=Registry(), **options)(lambda obj: None)


def test_system_namespaces_is_opt_in_per_decorator():
    reg = Registry()
    declop.validator("pods", registry=reg)(lambda obj: None)
    declop.mutator("pods", registry=reg, system_namespaces=True)(lambda obj: None)
    assert [h.system_namespaces for h in reg.webhooks] == [False, True]
    with pytest.raises(declop.errors.RegistrationError, match=r"unknown option system_namespace=: did you mean 'system_namespaces'\?"):
        declop.validator("pods", system_namespace=True)  # type: ignore[call-arg]
    with pytest.raises(declop.errors.RegistrationError, match="a conversion webhook converts objects of every namespace"):
        from declop.webhooks.declaration import make_webhook

        make_webhook(lambda obj: obj, "converter", "widgets.example.com", system_namespaces=True)


def test_misspelt_option_and_resource_in_parts():
    with pytest.raises(declop.errors.RegistrationError, match=r"unknown option failurePolicy=: did you mean 'failure_policy'\?"):
        declop.validator("widgets.example.com", failurePolicy="Fail")  # type: ignore[call-arg]
    with pytest.raises(declop.errors.RegistrationError, match=r"declop takes the resource as one string: @declop.reconciler\('widgets.example.com'\)"):
        declop.mutator("example.com", "v1", "widgets")  # type: ignore[misc]


def test_duplicate_names_and_frozen_registry():
    reg = Registry()

    def check(obj):
        return None

    declop.validator("widgets.example.com", registry=reg)(check)
    declop.validator("widgets.example.com", registry=reg)(check)  # imported twice: one entry
    assert len(reg.webhooks) == 1
    def another():
        def check(obj):
            return None

        return check

    with pytest.raises(declop.errors.RegistrationError, match="already registered; pass name="):
        declop.validator("widgets.example.com", registry=reg)(another())
    reg.freeze()
    with pytest.raises(declop.errors.RegistrationError, match="manager has already started"):
        declop.mutator("widgets.example.com", registry=reg)(check)
    reg.clear()
    assert reg.webhooks == []


def test_default_names():
    assert default_name("Check_Size", "widgets.v1.example.com") == "check-size.widgets.v1.example.com"
    assert default_name("f", "pods") == "f.pods.core"
    assert default_name("<lambda>", "deployments.apps") == "lambda.deployments.apps"


def test_rejected_message_and_field():
    exc = Rejected("must be at most 10", field="spec.size")
    assert exc.text == str(exc) == "spec.size: must be at most 10"
    assert exc.code == 403
    assert Rejected("no", code=422).code == 422
    with pytest.raises(ValueError, match="HTTP error status"):
        Rejected("no", code=200)
