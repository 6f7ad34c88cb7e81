"""`pin tenant …`: the scraping API's tenants, their keys, weights and webhook secrets."""

from __future__ import annotations

import json
import uuid

import click

from pin_orchestration.platform.db import engine_from_env


@click.group()
def tenant() -> None:
    """Tenants of the scraping API and their keys."""


@tenant.command("create")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help='Print {"id", "name", "api_key"}')
def tenant_create(name: str, as_json: bool) -> None:
    """Create a tenant and print its API key (shown once; only a hash is kept)."""
    from pin_orchestration.scraping.store.tenancy import TenantError, create_tenant

    try:
        created, key = create_tenant(engine_from_env(), name)
    except TenantError as exc:
        raise click.ClickException(str(exc)) from exc
    _print_key(created.id, created.name, key, as_json)


@tenant.command("rotate-key")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help='Print {"id", "name", "api_key"}')
def tenant_rotate_key(name: str, as_json: bool) -> None:
    """Give a tenant a new API key; the old one stops working at once."""
    from pin_orchestration.scraping.store.tenancy import TenantError, rotate_tenant_key

    try:
        rotated, key = rotate_tenant_key(engine_from_env(), name)
    except TenantError as exc:
        raise click.ClickException(str(exc)) from exc
    _print_key(rotated.id, rotated.name, key, as_json)


def _print_key(tenant_id: uuid.UUID, name: str, key: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"id": str(tenant_id), "name": name, "api_key": key}))
    else:
        click.echo(f"tenant {name} ({tenant_id})\nAPI key (shown once): {key}")


@tenant.command("list")
def tenant_list() -> None:
    """Tenants, their key prefixes and job counts."""
    from pin_orchestration.scraping.store.tenancy import list_tenants

    for t in list_tenants(engine_from_env()):
        click.echo(
            f"{t['name']}\t{t['id']}\tkey {t['api_key_prefix']}…\t{t['jobs']} job(s)\t"
            f"weight {_weight(t['weight'])}\tkey rotated {t['key_rotated_at'].isoformat()}"
        )


def _weight(weight: float) -> str:
    """The weight as stored, every digit (`:g` rounds to six: 1.0000001 read as 1)."""
    return repr(float(weight)).removesuffix(".0")


@tenant.command("set-weight")
@click.argument("name")
@click.argument("weight", type=float)
def tenant_set_weight(name: str, weight: float) -> None:
    """Give a tenant WEIGHT times the default share of picks inside each priority class
    (0.001 to 1000)."""
    from pin_orchestration.scraping.store.tenancy import TenantError, set_tenant_weight

    try:
        changed = set_tenant_weight(engine_from_env(), name, weight)
    except TenantError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"tenant {changed.name}: weight {_weight(weight)}")


@tenant.command("webhook-secret")
@click.argument("name")
@click.option("--rotate", is_flag=True, help="Replace it with a new secret first")
@click.option("--json", "as_json", is_flag=True, help='Print {"id", "name", "webhook_secret"}')
def tenant_webhook_secret(name: str, rotate: bool, as_json: bool) -> None:
    """Show (or rotate) the `whsec_<base64>` secret the tenant's completion webhooks are
    signed with (Standard Webhooks: give it to `standardwebhooks` / `svix` as it is).

    After --rotate, deliveries carry two signatures, with the new and the replaced secret,
    for PIN_WEBHOOK_SECRET_OVERLAP_SECONDS (default one day): a receiver keeps verifying
    with the old secret until it has the new one (docs/integration.md)."""
    from pin_orchestration.scraping.webhooks.deliveries import tenant_webhook_secret as read_secret

    try:
        row = read_secret(engine_from_env(), name, rotate=rotate)
    except KeyError as exc:
        raise click.ClickException(exc.args[0]) from exc
    if as_json:
        click.echo(
            json.dumps(
                {"id": str(row["id"]), "name": row["name"], "webhook_secret": row["webhook_secret"]}
            )
        )
    else:
        click.echo(
            f"tenant {row['name']} ({row['id']})\nwebhook secret: {row['webhook_secret']}\n"
            f"(since {row['webhook_secret_rotated_at'].isoformat()})"
        )
