package engine

// NotFoundVolume answers a lookup of a volume this node does not have.
// (Ids of other nodes never get this far: checkIDHere.)
func (d *Engine) NotFoundVolume(id string) error {
	if err := d.DamagedRecord("volume", id); err != nil {
		return err
	}
	return StorageErr(ErrNotFound, "volume %q does not exist", id)
}

// DamagedRecord answers a request for an id whose record start found
// damaged: its data is kept, and nothing is done to it until a person has
// looked.
func (d *Engine) DamagedRecord(kind, id string) error {
	for _, bad := range d.Records.Damaged() {
		if bad.ID == id {
			return StorageErr(ErrDamaged, "the record of %s %s at %s is damaged (%s); its data is kept: restore the record from a backup and restart the driver, or move the record and the data away to give it up", kind, id, bad.Path, bad.Problem)
		}
	}
	return nil
}
