"""One APIRouter per resource of the market API; `market.service.app.create_app` mounts them
all."""
